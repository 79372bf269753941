"""probe.json records and documents for tests that need a probe result without running the probe: every key the
probe writes for a cache-only record (trtkv.probe.metrics.length_record), through the model the readers use
(trtkv.contracts.probe_doc)."""

from __future__ import annotations

from typing import Any

from trtkv.contracts.probe_doc import ProbeDoc, ProbeRecord


def record_dict(fmt: str, n: int, kl: float, clip: float | None = None, bpt: float = 100.0, **more: Any) -> dict:
    """One record as probe.json holds it: KL `kl`, top-1 agreement 1 - kl, ppl 9 (+kl), `bpt` bytes per token."""
    return {"format": fmt, "context_len": n, "kl_mean": kl, "kl_last_quarter": kl, "ppl": 9.0 + kl, "ppl_ref": 9.0,
            "ppl_delta": kl, "top1_agreement": 1.0 - kl, "needle_accuracy": None, "clip_rate": clip,
            "k_clip_rate": None, "v_clip_rate": None, "kv_bytes_per_token": bpt, "kv_bytes_per_token_formula": bpt,
            "bytes_vs_formula": 1.0, "kv_semantics": "test", "positions": n - 1, "attention": "cache_only", **more}


def record(fmt: str, n: int, kl: float, clip: float | None = None, bpt: float = 100.0, **more: Any) -> ProbeRecord:
    return ProbeRecord.model_validate(record_dict(fmt, n, kl, clip, bpt, **more))


SMOLLM2 = {"source": "packaged:smollm2", "model_dir": "/models/smollm2-135m-instruct", "device": "cpu", "threads": 1,
           "compute_dtype": "float32", "num_layers": 30, "num_kv_heads": 3, "head_dim": 64}


def probe_json(records: list[dict], recipe: str = "r", **parts: Any) -> dict:
    """probe.json of `records` as the probe writes it: SmolLM2's model, the settings of their formats and lengths;
    `parts`: any other part (its settings over those, its model keys over SmolLM2's)."""
    settings = {"formats": list(dict.fromkeys(r["format"] for r in records)),
                "lengths": sorted({r["context_len"] for r in records}), "needle_lengths": [], "needle_depths": [0.5],
                "needle_seeds": 1, "decode_prompt": 1024, "decode_steps": 2}
    return {"recipe": recipe, "records": records, **parts, "model": {**SMOLLM2, **parts.get("model", {})},
            "settings": {**settings, **parts.get("settings", {})}}


def probe_doc(records: list[ProbeRecord], recipe: str = "r", **parts: Any) -> ProbeDoc:
    """probe_json of `records` through the model the readers take."""
    return ProbeDoc.model_validate(probe_json([r.model_dump(exclude_unset=True) for r in records], recipe, **parts))
