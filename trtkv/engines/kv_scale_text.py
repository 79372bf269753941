"""The KV scale audit as people read it: one table per checkpoint folder (per layer the stored
scales and K/V ratio, then what each engine uses on that layer), each engine's summary, and the
findings with their severity."""

from __future__ import annotations

import math
from pathlib import Path

from trtkv.engines.kv_scale_findings import FAIL, Audit, EngineVerdict
from trtkv.recipe.layout import HF

KINDS = ("k", "v", "kv", "q", "prob")
SHORT = {
    "separate": "k,v",
    "unity": "1.0",
    "unused": "1.0*",
    "k_for_both": "k,k",
    "shared": "kv",
    "crash": "CRASH",
    "unknown": "?",
}


def render_audit(audit: Audit) -> str:
    """The human table for one checkpoint folder."""
    kinds = [k for k in KINDS if any(k in r.scales for r in audit.rows)]
    engines = [e for e in audit.engines if e.applies and e.layers]
    head = (
        f"{audit.folder}\n  format {audit.format}, architecture {audit.architecture or '?'}, "
        f"KV {audit.kv_algo or 'not declared'}, names: {', '.join(audit.conventions) or '-'}"
    )
    cols = ["layer", *(f"{k}_scale" for k in kinds), "k/v", *(e.engine for e in engines)]
    rows = []
    for r in audit.rows:
        cells = [str(r.layer), *(_num(r.scales.get(k)) for k in kinds), _num(r.kv_ratio)]
        cells += [_uses(e, r.layer) for e in engines]
        rows.append(cells)
    lines = [head, ""] + _table(cols, rows) if rows else [head, "", "  no KV scale tensors"]
    lines += [
        "",
        "engines (what each uses per layer; k,v: its own K and V; k,k: K's for both; "
        "1.0*: never reads them):",
    ]
    lines += [f"  {e.engine} {e.version}: {e.summary}" for e in audit.engines]
    if audit.clip is not None:
        lines += ["", *_clip_lines(audit.clip)]
    lines += (
        ["", "findings:"]
        + [f"  {f.severity.upper():4} {f.code}: {f.message}" for f in audit.findings]
        if audit.findings
        else ["", "findings: none"]
    )
    return "\n".join(lines)


def serve_scale_lines(folder: Path, backend: str, recipe: str) -> list[str]:
    """What `trtkv serve` says before it starts the engine: the KV scales that engine will use per
    layer (the audit's summary for it) and, when findings fail, the first and where to read them."""
    from trtkv.engines.kv_scale_audit import audit_folder
    from trtkv.recipe import Backend
    from trtkv.recipe.backend_rules import BACKEND_ROWS

    engine = BACKEND_ROWS[Backend(backend)].scale_loader
    # an incomplete checkpoint is the stage's own input check to report, not the audit's
    if not any(p.is_dir() and any(p.glob("*.safetensors")) for p in (folder, folder / HF)):
        return []
    audits = audit_folder(folder, [engine])
    lines = [
        f"KV scales ({e.engine} {e.version}, {a.folder}): {e.summary}"
        for a in audits
        for e in a.engines
        if e.applies
    ]
    fails = [f for a in audits for f in a.findings if f.severity == FAIL]
    if fails:
        lines.append(
            f"warning: {len(fails)} KV scale finding(s) fail, first: {fails[0].message}. Next: "
            f"`trtkv scales {recipe}` (docs/kv-scales.md)"
        )
    return lines


def _clip_lines(clip: dict) -> list[str]:
    if clip.get("unknown"):
        return [f"clip cost: unknown ({clip['unknown']})"]
    out = [f"clip cost ({clip['source']}; fail above {clip['threshold']:.3%} of a layer's values):"]
    for engine, layers in clip["engines"].items():
        worst = max(layers, key=lambda x: max(x["k_clip"], x["v_clip"]), default=None)
        if worst is None:
            continue
        out.append(
            f"  {engine}: worst layer {worst['layer']}: K {worst['k_clip']:.3%}, "
            f"V {worst['v_clip']:.3%} of values clipped (scale k {worst['k_scale']:.4g}, "
            f"v {worst['v_scale']:.4g}; fresh amax k {worst['k_amax']:.4g}, "
            f"v {worst['v_amax']:.4g})"
        )
    return out


def _uses(e: EngineVerdict, layer: int) -> str:
    el = next((x for x in e.layers if x.layer == layer), None)
    if el is None:
        return "-"
    if el.uses in ("crash", "unity", "unused", "unknown"):
        return SHORT[el.uses]
    return (
        f"{SHORT[el.uses]} {_num(el.k)}/{_num(el.v)}"
        if el.k != el.v
        else f"{SHORT[el.uses]} {_num(el.k)}"
    )


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    if math.isnan(x) or math.isinf(x):
        return str(x)
    return f"{x:.4g}"


def _table(cols: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    fmt = "  " + "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*cols).rstrip()] + [fmt.format(*r).rstrip() for r in rows]
