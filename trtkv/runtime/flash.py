"""Batch-invariant prefill attention through torch's CPU flash-attention kernel, for full
(non-sliding) layers.

The kernel (`aten._scaled_dot_product_flash_attention_for_cpu`) walks a query row's keys in blocks
of 512 (kvSplitSize), keeping a running max, sum and output; each block is one (query rows x d) x (d
x 512) GEMM, one 512-long exp-and-sum per row and one (rows x 512) x (512 x d) GEMM added to the
output. We give it keys padded to a multiple of FLASH_KEYS and an explicit 0/-inf mask (no
is_causal, whose last block's width follows the chunk), so every block is full: a block past a row's
position is all -inf for that row and leaves its max, sum and output exactly as they were (scale
exp(0) = 1, + 0). A row's result then depends on its position and its keys only, not on the other
rows of the call (the GEMMs' M; MKL computes a row of a full row panel alike for any M, see
trtkv.runtime.invariant) nor on the chunk's end. That rests on the kernel's blocking, which torch
may change, so flash_ok() checks it once per model on its own head shapes (a prompt whole vs in
chunks, bit for bit); where it fails, or for sliding-window layers (a row whose first block is all
-inf), key_tiles.attend_tiles runs instead. One kernel call per 512-row block replaces ~10 tensor
ops per tile: on 2 busy cores every op's thread sync costs.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

FLASH_KEYS = 512  # the kernel's key block (kvSplitSize); keys are padded to a multiple of it
_OK: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def flash_plan(positions: torch.Tensor, end: int) -> list[tuple[int, int, int, torch.Tensor]]:
    """Rows at `positions` (W,) over keys 0..end-1, in blocks of rows whose positions share a
    FLASH_KEYS span: (r0, r1, T, mask) with T the padded key count the block reads and mask (1, 1,
    r1 - r0, T), -inf on a row's invisible keys (after its position, or past `end`). Built once per
    chunk, used by every full layer."""
    import torch

    blocks = []
    pos = positions.tolist()
    r0 = 0
    while r0 < len(pos):
        span = pos[r0] // FLASH_KEYS
        r1 = r0
        while r1 < len(pos) and pos[r1] // FLASH_KEYS == span:
            r1 += 1
        keys = (span + 1) * FLASH_KEYS
        kpos = torch.arange(keys)[None]
        qpos = positions[r0:r1, None]
        mask = torch.zeros(r1 - r0, keys).masked_fill_((kpos > qpos) | (kpos >= end), float("-inf"))
        blocks.append((r0, r1, keys, mask[None, None]))
        r0 = r1
    return blocks


def attend_flash(
    scaling: float,
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    plan: list[tuple[int, int, int, torch.Tensor]],
) -> torch.Tensor:
    """Rows q (W, H, d) over keys/values (Hkv, end, d) holding positions 0..end-1, per flash_plan
    block. Returns (W, H * d)."""
    import torch
    import torch.nn.functional as F

    w, heads, d = q.shape
    kv_heads, end = keys.shape[0], keys.shape[1]
    most = max(t for _, _, t, _ in plan)
    k = F.pad(keys, (0, 0, 0, max(0, most - end)))[:, :most].repeat_interleave(
        heads // kv_heads, 0
    )[None]
    v = F.pad(values, (0, 0, 0, max(0, most - end)))[:, :most].repeat_interleave(
        heads // kv_heads, 0
    )[None]
    qh = q.transpose(0, 1)[None]  # (1, H, W, d)
    kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    outs = []
    for r0, r1, t, mask in plan:
        o = kernel(
            qh[:, :, r0:r1], k[:, :, :t], v[:, :, :t], 0.0, False, attn_mask=mask, scale=scaling
        )[0]
        outs.append(o[0].transpose(0, 1).reshape(r1 - r0, heads * d))
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def flash_ok(model: Any, rows: int = 16) -> bool:
    """Whether attend_flash gives every row bit-equal whatever chunk it came in, on this model's
    head shapes: a 1100-token prompt whole vs in chunks of 37 rows (rows padded to `rows`-aligned
    spans as prefill_rows pads them); checked once per model (a few ms)."""
    import torch

    cached = _OK.get(model)
    if cached is not None:
        return cached
    attn = model.model.layers[0].self_attn
    d = attn.head_dim
    kv_heads, heads = attn.k_proj.out_features // d, attn.q_proj.out_features // d
    gen = torch.Generator().manual_seed(0)
    n = 1100
    q = torch.randn(n + rows, heads, d, generator=gen)
    keys, values = (
        torch.randn(kv_heads, n, d, generator=gen),
        torch.randn(kv_heads, n, d, generator=gen),
    )
    ok = True
    try:
        with torch.inference_mode():
            top = -(-n // rows) * rows
            whole = attend_flash(0.125, q[:top], keys, values, flash_plan(torch.arange(top), n))[:n]
            for start in range(0, n, 37):
                end = min(n, start + 37)
                base, top = start - start % rows, -(-end // rows) * rows
                part = attend_flash(
                    0.125,
                    q[base:top],
                    keys[:, :end],
                    values[:, :end],
                    flash_plan(torch.arange(base, top), end),
                )
                ok = ok and torch.equal(part[start - base : end - base], whole[start:end])
    except RuntimeError:  # the kernel is missing or refuses these shapes: the tile path runs
        ok = False
    _OK[model] = ok
    return ok
