"""An engine attention kernel's numerics in torch (the kernels: trtkv.kvcache.attention_modes): Q
quantized to FP8 with its scale, K/V as the cache stores them (or the prompt's own 16-bit K/V),
scores in float32, and the softmax probabilities P quantized to FP8 per KV tile the way the
FlashAttention-style kernels do it:

    for each KV tile j (in the kernel's order): m_j = max(m_{j-1}, max of the tile's scores)
        P_j = fp8(exp(s - m_j) * p_scale),  acc = acc * exp(m_{j-1} - m_j) + P_j @ V_j / p_scale
        l   = l * exp(m_{j-1} - m_j) + sum(exp(s - m_j))          (the row sum from the unquantized P)
    O = acc / l

Vectorised: the running max per tile is a cumulative max over the tiles' maxima (reversed for
kernels that walk the tiles last to first), so the result equals the loop above up to float32
rounding; the FP8 grid is applied exactly. Tiles are aligned to absolute token position 0, as the
kernels index KV blocks, so a query row's tiles are the same in a chunked prefill as in one pass;
they differ between kernels whose tile sizes differ (prefill vs decode). Assumptions: one split (no
split-KV decode) and float32 accumulation inside a tile (FP8 tensor cores accumulate with fewer
bits; not modelled, trtkv/data/kv_formats.json says where).
"""  # noqa: E501

from __future__ import annotations

import torch
import torch.nn.functional as F

from trtkv.kvcache.attention_modes import KernelNumerics
from trtkv.kvcache.formats import FP8_MAX

SCORE_BUDGET_BYTES = 256 << 20  # float32 score elements per query chunk (x ~5 temporaries)


def fp8_e4m3(x: torch.Tensor) -> torch.Tensor:
    """x rounded to the FP8 E4M3 grid (round to nearest even, saturating at +-448), as float32: the
    value the GPU's cvt.rn.satfinite.e4m3 gives back (clamped first: torch's CUDA cast turns |x| >
    448 into NaN)."""
    wide = torch.promote_types(x.dtype, torch.float32)  # float32, or float64 for exact tests
    return x.to(wide).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(wide)


def quantize_q(query: torch.Tensor, kernel: KernelNumerics, q_scale: float) -> torch.Tensor:
    """Q as the kernel reads it (float32; float64 stays): FP8 E4M3 of query / q_scale, times
    q_scale; unchanged for 16-bit Q."""
    q = query.to(torch.promote_types(query.dtype, torch.float32))
    if kernel.q == "none":
        return q
    return fp8_e4m3(q / q_scale) * q_scale


def _tiled_weights(
    s: torch.Tensor, first_pos: int, tile: int, order: str, p_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights w, row sums l) with softmax(s) @ V ~ (w @ V) / l: w = fp8(exp(s - m_tile) * p_scale)
    / p_scale * exp(m_tile - m), l = sum exp(s - m); s [..., S] float32 scores (-inf where masked),
    key 0 at first_pos."""
    length = s.shape[-1]
    lead = first_pos % tile
    n_tiles = -(-(lead + length) // tile)
    st = F.pad(s, (lead, n_tiles * tile - lead - length), value=float("-inf")).unflatten(
        -1, (n_tiles, tile)
    )
    tile_max = st.amax(-1)
    if order == "first_to_last":
        run = tile_max.cummax(-1).values
        top = run[..., -1]
    else:
        run = tile_max.flip(-1).cummax(-1).values.flip(-1)
        top = run[..., 0]
    run = torch.where(torch.isfinite(run), run, torch.zeros_like(run))
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    p = (st - run.unsqueeze(-1)).exp_()  # in [0, 1]; exactly 0 where masked
    rescale = (run - top.unsqueeze(-1)).exp_()
    # the unquantized row sum, relative to the row max
    total = (p * rescale.unsqueeze(-1)).sum((-2, -1))
    p = fp8_e4m3(p.mul_(p_scale)).div_(p_scale).mul_(rescale.unsqueeze(-1))
    return p.flatten(-2)[..., lead : lead + length], total


def _last_key(mask: torch.Tensor) -> int:
    """The last key any row of `mask` [..., rows, S] may attend (-1: none)."""
    seen = mask.reshape(-1, mask.shape[-1]).any(0).nonzero()
    return int(seen[-1]) if seen.numel() else -1


def kernel_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    allowed: torch.Tensor | None,
    scaling: float,
    kernel: KernelNumerics,
    q_scale: float = 1.0,
    first_pos: int = 0,
    tile: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Attention of query [B, Hq, T, D] over key/value [B, Hkv, S, D] (grouped heads: query head h
    reads KV head h // (Hq / Hkv)) with `kernel`'s numerics; allowed: bool [B or 1, 1, T, S] (True =
    attend) or None (all); first_pos: the absolute position of key 0 (the KV tile grid starts at
    position 0). Returns [B, Hq, T, D] in float32 (float64 for float64 inputs)."""
    b, hq, t, d = query.shape
    hkv, length = key.shape[1], key.shape[2]
    group = hq // hkv
    q = quantize_q(query, kernel, q_scale).view(b, hkv, group, t, d)
    wide = q.dtype
    k, v = key.to(wide).unsqueeze(2), value.to(wide).unsqueeze(2)
    mask = None if allowed is None else allowed.view(allowed.shape[0], 1, 1, t, length)
    rows = max(1, SCORE_BUDGET_BYTES // max(1, 4 * b * hq * length))
    out = []
    for r0 in range(0, t, rows):
        r1 = min(t, r0 + rows)
        # later keys: masked for all rows
        end = length if mask is None else max(1, _last_key(mask[..., r0:r1, :]) + 1)
        s = torch.matmul(q[:, :, :, r0:r1], k[..., :end, :].transpose(-1, -2)).mul_(scaling)
        if softcap:
            s = torch.tanh(s / softcap) * softcap
        if mask is not None:
            s = s.masked_fill(~mask[..., r0:r1, :end], float("-inf"))
        if kernel.p == "none" or tile is None:
            top = s.amax(-1, keepdim=True)
            top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
            w = (s - top).exp_()
            total = w.sum(-1)
        else:
            w, total = _tiled_weights(s, first_pos, tile, kernel.tile_order, kernel.p_scale)
        o = torch.matmul(w, v[..., :end, :]) / total.clamp(min=torch.finfo(wide).tiny).unsqueeze(-1)
        out.append(o)
    return torch.cat(out, dim=3).reshape(b, hq, t, d)
