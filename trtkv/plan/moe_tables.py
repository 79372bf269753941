"""The fused MoE op's kernel data as one GPU and engine have it (issue #49): the per-dtype fits of
speed_efficiencies.json at the GPU's own tensor-core peaks, and the engine table's own rows per
expert shape and moe_tp/EP (`make speed-efficiencies`, tools/aic_kernels.py): a prefill's
power-law rows (trtkv/data/moe_prefill_rows.json, --moe-rows), which shape_row_ms reads, and a
decode step's balanced rows (trtkv/data/moe_decode_rows.json, --moe-decode-rows), which
decode_row_ms reads (trtkv.plan.moe_step.routed_ms prices a step with both).

A GPU without tables of its own (speed.AIC_SYSTEM) gets no rows: they are the lender's times on
the lender's chip; its fits keep the lender's efficiencies at its own peaks (H20: 148 BF16 and 296
FP8 dense TFLOPS where H100 has 989 and 1,979).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

MOE_ROWS = Path(__file__).resolve().parents[1] / "data" / "moe_prefill_rows.json"
MOE_DECODE_ROWS = MOE_ROWS.with_name("moe_decode_rows.json")
Rows = dict[str, dict[str, dict[str, list[float]]]]  # dtype -> shape -> "moe_tp/ep" -> ms


class RowShape(Protocol):
    """What the row lookups read of a moe_step.MoEShape (typed by shape: moe_step imports this)."""

    @property
    def hidden(self) -> int: ...
    @property
    def expert_params(self) -> float: ...
    @property
    def top_k(self) -> int: ...
    @property
    def experts(self) -> int: ...
    @property
    def moe_tp(self) -> int: ...
    @property
    def ep(self) -> int: ...


class RowKernels(Protocol):
    """What the row lookups read of a speed.Kernels."""

    @property
    def moe_rows(self) -> Rows: ...
    @property
    def moe_row_tokens(self) -> tuple[int, ...]: ...
    @property
    def moe_decode_rows(self) -> Rows: ...
    @property
    def moe_decode_tokens(self) -> tuple[int, ...]: ...


@lru_cache(maxsize=2)
def load_moe_rows(path: Path = MOE_ROWS) -> dict[str, Any]:
    return json.loads(path.read_text())


def moe_kernels(
    table: str,
    fits: dict[str, dict[str, Any]],
    own_flops: dict[str, float],
    lender: dict[str, Any] | None,
) -> tuple[dict[str, dict[str, Any]], Rows, tuple[int, ...], Rows, tuple[int, ...]]:
    """(fits, prefill rows, their token counts, decode rows, theirs) for one "system/engine" table;
    `lender` (the system YAML's gpu figures) set: a borrowed GPU, its fits' peaks scaled by their
    lane's ratio (BF16 up to the lender's BF16 peak, else FP8's: FP4 too) and no rows."""
    doc, dec = load_moe_rows(), load_moe_rows(MOE_DECODE_ROWS)
    tokens, dec_tokens = tuple(doc["tokens"]), tuple(dec["tokens"])
    if lender is None:
        rows, dec_rows = doc["tables"].get(table, {}), dec["tables"].get(table, {})
        return (
            fits,
            {k: v for k, v in rows.items() if k != "version"},
            tokens,
            {k: v for k, v in dec_rows.items() if k != "version"},
            dec_tokens,
        )
    bf16 = float(lender["bfloat16_tc_flops"])
    peaks = {"bfloat16": bf16, "fp8": float(lender.get("fp8_tc_flops") or bf16)}
    own = {}
    for dtype, fit in fits.items():
        lane = "bfloat16" if fit["peak_flops"] <= peaks["bfloat16"] else "fp8"
        own[dtype] = {**fit, "peak_flops": fit["peak_flops"] * own_flops[lane] / peaks[lane]}
    return own, {}, tokens, {}, dec_tokens


def _table_row(rows: dict[str, dict[str, list[float]]], moe: RowShape) -> list[float]:
    """The rows of an engine table's dtype for this expert shape (hidden/inter/top-k/experts) at
    its moe_tp/EP; empty where the table lacks them."""
    inter = moe.expert_params / (3 * moe.hidden)  # gate, up and down: 3 x hidden x inter
    if abs(inter - round(inter)) > 1e-6:
        return []
    key = f"{moe.hidden}/{round(inter)}/{moe.top_k}/{moe.experts}"
    return rows.get(key, {}).get(f"{moe.moe_tp}/{moe.ep}") or []


def decode_row_ms(k: RowKernels, moe: RowShape, table: str, experts: float) -> float | None:
    """The fused MoE op's time for a step whose busiest EP rank reads `experts` distinct experts,
    from the engine table's own balanced rows for this expert shape and moe_tp/EP
    (tools/aic_kernels.py --moe-decode-rows: N tokens read min(E, N k) / EP experts a rank):
    linear in the experts read between rows, the first row's time below it, the last two rows'
    slope beyond them; None where no row is."""
    row = _table_row(k.moe_decode_rows.get(table, {}), moe)
    if len(row) < 2 or experts <= 0:
        return None
    reads = [min(moe.experts, n * moe.top_k) / moe.ep for n in k.moe_decode_tokens[: len(row)]]
    if experts <= reads[0]:
        return row[0]
    j = next((i for i, x in enumerate(reads) if x >= experts), len(reads) - 1)
    share = (experts - reads[j - 1]) / (reads[j] - reads[j - 1])
    return row[j - 1] + share * (row[j] - row[j - 1])


def shape_row_ms(k: RowKernels, moe: RowShape, table: str, tokens: float) -> float | None:
    """The fused MoE op's time for `tokens` (the expert group's) from the engine table's own rows
    for this expert shape and moe_tp/EP (tools/aic_kernels.py --moe-rows, power-law expert load):
    linear between rows, at the nearest row's time per token outside them; None where no row is."""
    row = _table_row(k.moe_rows.get(table, {}), moe)
    if not row or tokens <= 0:
        return None
    grid = k.moe_row_tokens
    if tokens <= grid[0] or tokens >= grid[-1]:
        i = 0 if tokens <= grid[0] else -1
        return row[i] * tokens / grid[i]
    j = next(i for i, n in enumerate(grid) if n >= tokens)
    share = (tokens - grid[j - 1]) / (grid[j] - grid[j - 1])
    return row[j - 1] + share * (row[j] - row[j - 1])
