"""The fused MoE op's kernel data as one GPU and engine have it (issue #49): the per-dtype fits of
speed_efficiencies.json at the GPU's own tensor-core peaks, and the engine table's own rows per
expert shape and moe_tp/EP (trtkv/data/moe_prefill_rows.json: `make speed-efficiencies`,
tools/aic_kernels.py --moe-rows), which trtkv.plan.moe_step.shape_row_ms reads for a prefill.

A GPU without tables of its own (speed.AIC_SYSTEM) gets no rows: they are the lender's times on
the lender's chip; its fits keep the lender's efficiencies at its own peaks (H20: 148 BF16 and 296
FP8 dense TFLOPS where H100 has 989 and 1,979).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

MOE_ROWS = Path(__file__).resolve().parents[1] / "data" / "moe_prefill_rows.json"
Rows = dict[str, dict[str, dict[str, list[float]]]]  # dtype -> shape -> "moe_tp/ep" -> ms


@lru_cache(maxsize=1)
def load_moe_rows(path: Path = MOE_ROWS) -> dict[str, Any]:
    return json.loads(path.read_text())


def moe_kernels(
    table: str,
    fits: dict[str, dict[str, Any]],
    own_flops: dict[str, float],
    lender: dict[str, Any] | None,
) -> tuple[dict[str, dict[str, Any]], Rows, tuple[int, ...]]:
    """(fits, rows, the rows' token counts) for one "system/engine" table; `lender` (the system
    YAML's gpu figures) set: a borrowed GPU, its fits' peaks scaled by their lane's ratio (BF16 up
    to the lender's BF16 peak, else FP8's: FP4 too) and no rows."""
    doc = load_moe_rows()
    tokens = tuple(doc["tokens"])
    if lender is None:
        rows = doc["tables"].get(table, {})
        return fits, {k: v for k, v in rows.items() if k != "version"}, tokens
    bf16 = float(lender["bfloat16_tc_flops"])
    peaks = {"bfloat16": bf16, "fp8": float(lender.get("fp8_tc_flops") or bf16)}
    own = {}
    for dtype, fit in fits.items():
        lane = "bfloat16" if fit["peak_flops"] <= peaks["bfloat16"] else "fp8"
        own[dtype] = {**fit, "peak_flops": fit["peak_flops"] * own_flops[lane] / peaks[lane]}
    return own, {}, tokens
