"""Probe results on disk, read by the planner (no torch here: `trtkv plan` must start fast)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from trtkv import paths

if TYPE_CHECKING:
    from trtkv.recipe import Recipe


def default_probe_dir(recipe: Recipe) -> Path:
    return paths.recipe_output_dir(recipe.name) / "probe"


def load_probe(recipe: Recipe, probe_dir: Path | None = None) -> dict | None:
    path = (probe_dir or default_probe_dir(recipe)) / "probe.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def probe_advice(recipe: Recipe, probe_dir: Path | None = None) -> tuple[list[str], str] | None:
    """Advice built from measured probe records, or None when there are none for this model."""
    data = load_probe(recipe, probe_dir)
    if not data or not data.get("records"):
        return None
    records = data["records"]
    longest = max(r["context_len"] for r in records)
    rows = sorted((r for r in records if r["context_len"] == longest), key=lambda r: r.get("kv_bytes_per_token", 0))
    out = []
    for r in rows:
        needle = r.get("needle_accuracy")
        needle_txt = f", needle {needle:.0%}" if needle is not None else ""
        out.append(f"{r['format']} at {longest} tokens: KL {r['kl_mean']:.4f}, top-1 agreement "
                   f"{r['top1_agreement']:.1%}, ppl delta {r['ppl_delta']:+.3f}{needle_txt}")
    return out, f"measured by `trtkv probe` on this model ({len(records)} records)"
