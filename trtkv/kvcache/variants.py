"""Engine KV formats that share a trtkv storage (FormatChoice.variant): vLLM's fp8_e5m2,
per-attention-head static FP8 scales (fp8_attn_head) and nvfp4_4over6, and ModelOpt 0.47's
nvfp4_cast and nvfp4_rotate; numerics and codecs.

- fp8_e5m2 (vLLM 0.32 `--kv-cache-dtype fp8_e5m2`): x cast to E5M2 (round to nearest even,
  saturating at 57344), scale 1.0 (vLLM warns about k/v_scale 1.0 for e4m3 only: e5m2 runs
  unscaled).
- fp8_attn_head (llm-compressor strategy="attn_head", vLLM's FlashAttention backend): E4M3 of x /
  scale[head], one float32 scale per (layer, KV head) for K and for V: max(head amax, 1e-12) / 448,
  the numbers trtkv.kvcache.attn_head computes and vLLM loads as k_scale/v_scale [num_kv_heads].
- nvfp4_4over6 (vLLM 0.32 `--kv-cache-dtype nvfp4_4over6`; its store kernel
  cvt_warp_fp16_to_fp4_4over6 in csrc/libtorch_stable/nvfp4_kv_cache_kernels.cu, vllm-project/vllm
  PR #45187): NVFP4's layout, k/v_scale the float32 global (amax / 448, trtkv's nvfp4 globals). Per
  block of 16, in float32: s = 1 / k_scale; for d in (6, 4) the block scale E4M3(s x (amax x
  rcp(d))) (round to nearest even, saturating), outputScale = rcp(E4M3 x rcp(s)) (0 when the scale
  is 0: the block is stored as zeros), codes E2M1(x x outputScale) and the error sum of (E2M1 x
  rcp(outputScale)
  - x)^2 pair by pair; amax/4 is kept when its error is strictly smaller. rcp.approx.ftz is modelled
    as the float32
  reciprocal (the GPU's may differ by an ulp: then a code next to an E2M1 tie can differ).
- nvfp4_cast / nvfp4_rotate (ModelOpt's NVFP4 fake quantization,
  modelopt/torch/kernels/quantization/gemm/ fp4_kernel_hopper.py + common/nvfp4_quant.py): global
  scale gs = float32(amax) / 2688 (6 x 448); per block of 16 the step E4M3(min(block amax / (6 gs),
  448)) x gs, a step below 1e-5 replaced by 1.0; |x| / step rounded to E2M1 with ties to the even
  code. nvfp4_cast: amax is the constant 448 (use_constant_amax, TensorQuantizer._get_amax).
  nvfp4_rotate: K is first rotated by ModelOpt's normalized Hadamard (normalized_hadamard_transform:
  Sylvester H / sqrt(b) over blocks of b = head_dim when a power of two, else its largest
  power-of-two divisor, in the model dtype) and its amax is the calibrated max |H k|; Q gets the
  same rotation (unquantized), so Q.K is unchanged: trtkv rotates the dequantized K back instead (H
  is symmetric and orthonormal). V is NVFP4 unrotated with its own amax.
"""

from __future__ import annotations

import torch

from trtkv.core.errors import TrtkvError
from trtkv.kvcache.attn_head import attn_head_scales
from trtkv.kvcache.codec_base import Codec, NVFP4Codec
from trtkv.kvcache.formats import E2M1_MAX, FP8_MAX, NVFP4_BLOCK
from trtkv.kvcache.names import ENGINE_VARIANTS
from trtkv.kvcache.numerics import (
    HeadScale,
    KVScale,
    e2m1_codes,
    e2m1_values,
    fp8_dequantize,
    hadamard,
    pack,
    unpack,
)

E5M2_MAX = 57344.0  # E5M2's largest finite value
MODELOPT_FP4_GLOBAL_DIV = 6.0 * 448.0  # ModelOpt: global_scale = global_amax / (6 x 448)
MODELOPT_MIN_STEP = 1e-5  # fp4_fake_quant_kernel: a block step below this becomes 1.0
# TensorQuantizer._get_amax with use_constant_amax: finfo(float8_e4m3fn).max
MODELOPT_CONSTANT_AMAX = 448.0
FOUR_OVER_SIX = 4.0  # nvfp4_4over6's second candidate maps a block's amax to 4 instead of 6


def e5m2_quantize(x: torch.Tensor) -> torch.Tensor:
    """E5M2 codes of x (round to nearest even, saturating at +-57344 as cvt.rn.satfinite)."""
    return x.float().clamp(-E5M2_MAX, E5M2_MAX).to(torch.float8_e5m2)


def head_scale(head_amax: list[float]) -> HeadScale:
    """One layer's per-KV-head FP8 scales as vLLM loads them: float32 of
    trtkv.kvcache.attn_head.attn_head_scales."""
    values = torch.tensor(attn_head_scales(head_amax), dtype=torch.float64)
    return HeadScale(tuple(float(v) for v in values.to(torch.float32)))


def _heads(scale: HeadScale, x: torch.Tensor) -> torch.Tensor:
    s = torch.tensor(scale.scales, dtype=torch.float32, device=x.device)
    if s.numel() != x.shape[1]:
        raise TrtkvError(
            f"fp8_attn_head: {s.numel()} per-head scales for {x.shape[1]} KV heads. Next: "
            "calibrate the scales for this model."
        )
    return s.view(1, -1, 1, 1)


def attn_head_quantize(x: torch.Tensor, scale: HeadScale) -> torch.Tensor:
    """E4M3 codes of x / scale[head] (float32 division, saturating at +-448)."""
    return (x.float() / _heads(scale, x)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def attn_head_dequantize(q: torch.Tensor, scale: HeadScale, dtype: torch.dtype) -> torch.Tensor:
    return (fp8_dequantize(q, 1.0, torch.float32) * _heads(scale, q)).to(dtype)


def _blocks(x: torch.Tensor) -> torch.Tensor:
    *lead, d = x.shape
    if d % NVFP4_BLOCK:
        raise TrtkvError(
            f"NVFP4 quantizes blocks of {NVFP4_BLOCK} elements; head_dim {d} is not a multiple of "
            "it."
        )
    return x.float().reshape(*lead, d // NVFP4_BLOCK, NVFP4_BLOCK)


def _e2m1_roundtrip(blocks: torch.Tensor, step: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    codes = e2m1_codes(blocks / step.unsqueeze(-1))
    return codes, e2m1_values(codes) * step.unsqueeze(-1)


def _rcp(x: torch.Tensor) -> torch.Tensor:
    """rcp.approx.ftz.f32 modelled as the float32 reciprocal (exact for the powers of two; 1 ulp at
    most otherwise)."""
    return torch.reciprocal(x.float())


def _vllm_candidate(
    blocks: torch.Tensor, amax: torch.Tensor, sf_scale: torch.Tensor, top: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One nvfp4_candidate_scale + nvfp4_reconstruction_error of vLLM's store kernel, float32 step
    by step: (E2M1 codes, E4M3 block scale, the block's squared error as the kernel sums it)."""
    # satfinite RN
    sf = (sf_scale * (amax * _rcp(torch.tensor(top)))).clamp(max=FP8_MAX).to(torch.float8_e4m3fn)
    sf32 = sf.float()
    out_scale = torch.where(
        sf32 != 0, _rcp(sf32 * _rcp(sf_scale)), torch.zeros_like(sf32)
    ).unsqueeze(-1)
    scaled = blocks * out_scale
    # cvt.rn.satfinite.e2m1x2.f32: -0 too
    codes = e2m1_codes(scaled) | (torch.signbit(scaled).to(torch.uint8) << 3)
    dequant = torch.where(out_scale != 0, _rcp(out_scale), torch.zeros_like(out_scale))
    diff = e2m1_values(codes) * dequant - blocks
    err = torch.zeros_like(amax)
    for i in range(0, NVFP4_BLOCK, 2):  # error += dx * dx + dy * dy, pair by pair
        err = err + (diff[..., i] * diff[..., i] + diff[..., i + 1] * diff[..., i + 1])
    return codes, sf, err


def nvfp4_4over6_quantize(
    x: torch.Tensor, global_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's nvfp4_4over6 store (cvt_warp_fp16_to_fp4_4over6) over the last dim: per block of 16
    the amax/6 and the amax/4 candidates, the one with the smaller squared error kept (a tie keeps
    amax/6); global_scale is k/v_scale."""
    blocks = _blocks(x)
    amax = blocks.abs().amax(-1)
    sf_scale = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(
        global_scale, dtype=torch.float32
    )
    codes6, sf6, err6 = _vllm_candidate(blocks, amax, sf_scale, E2M1_MAX)
    codes4, sf4, err4 = _vllm_candidate(blocks, amax, sf_scale, FOUR_OVER_SIX)
    four = err4 < err6
    best_codes = torch.where(four.unsqueeze(-1), codes4, codes6)
    best_scale = torch.where(four, sf4.view(torch.uint8), sf6.view(torch.uint8)).view(
        torch.float8_e4m3fn
    )
    return best_codes.reshape(x.shape), best_scale


def modelopt_global_scale(amax: float) -> float:
    """ModelOpt's NVFP4 global scale: float32(amax) / (6 x 448) in float32."""
    return float(torch.tensor(amax, dtype=torch.float32) / MODELOPT_FP4_GLOBAL_DIV)


def modelopt_step(block_scale: torch.Tensor, global_scale: float) -> torch.Tensor:
    """The block's step E4M3 x gs (gs <= 0 counts as 1e-12), a step below 1e-5 replaced by 1.0
    (fp4_fake_quant_kernel)."""
    gs = torch.tensor(global_scale if global_scale > 0 else 1e-12, dtype=torch.float32)
    step = block_scale.float() * gs
    return torch.where(step >= MODELOPT_MIN_STEP, step, torch.ones_like(step))


def modelopt_nvfp4_quantize(x: torch.Tensor, amax: float) -> tuple[torch.Tensor, torch.Tensor]:
    """ModelOpt's NVFP4 fake quantization as codes: (E2M1 codes [..., D], E4M3 block scales [...,
    D/16])."""
    blocks = _blocks(x)
    gs = torch.tensor(modelopt_global_scale(amax) or 1e-12, dtype=torch.float32)
    block_amax = blocks.abs().amax(-1)
    block_scale = (block_amax / (torch.tensor(E2M1_MAX, dtype=torch.float32) * gs)).clamp(
        max=FP8_MAX
    )
    block_scale = block_scale.to(torch.float8_e4m3fn)
    codes, _ = _e2m1_roundtrip(blocks, modelopt_step(block_scale, float(gs)))
    return codes.reshape(x.shape), block_scale


def modelopt_nvfp4_dequantize(
    codes: torch.Tensor, block_scale: torch.Tensor, amax: float, dtype: torch.dtype
) -> torch.Tensor:
    *lead, d = codes.shape
    values = e2m1_values(codes).reshape(*lead, d // NVFP4_BLOCK, NVFP4_BLOCK)
    step = modelopt_step(block_scale, modelopt_global_scale(amax) or 1e-12)
    return (values * step.unsqueeze(-1)).reshape(*lead, d).to(dtype)


def modelopt_hadamard_block(d: int) -> int:
    """normalized_hadamard_transform's block: d when a power of two, else its largest power-of-two
    divisor (>= 2)."""
    b = d if d > 0 and not d & (d - 1) else d & -d
    if b < 2:
        raise TrtkvError(
            f"nvfp4_rotate: head_dim {d} has no power-of-two divisor >= 2 for ModelOpt's Hadamard."
        )
    return b


def modelopt_hadamard(x: torch.Tensor) -> torch.Tensor:
    """ModelOpt's normalized Hadamard rotation over the last dim: Sylvester H / sqrt(b) per block of
    b, computed in float32 (as fast_hadamard_transform's kernel) and returned in x's dtype; its own
    inverse."""
    d = x.shape[-1]
    b = modelopt_hadamard_block(d)
    xb = x.float().reshape(*x.shape[:-1], d // b, b)
    return (hadamard(xb) * b**-0.5).reshape(x.shape).to(x.dtype)


def modelopt_fake_quant(x: torch.Tensor, amax: float) -> torch.Tensor:
    """What ModelOpt's k/v_bmm_quantizer returns for x (NVFP4 fake quantization, no rotation)."""
    codes, scale = modelopt_nvfp4_quantize(x, amax)
    return modelopt_nvfp4_dequantize(codes, scale, amax, x.dtype)


# ----------------------------------------------------------------------------- codecs


class E5M2Codec(Codec):
    """vLLM's fp8_e5m2: an unscaled E5M2 cast."""

    static = True
    limit = E5M2_MAX

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"data": e5m2_quantize(x)}

    def decode(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        return parts["data"].to(torch.float32).to(dtype)

    def static_bytes(self) -> int:
        return 0


class AttnHeadCodec(Codec):
    """fp8_attn_head: E4M3 with a static float32 scale per KV head."""

    static = True

    def __init__(self, scale: HeadScale):
        self.scale = scale
        self.limit = FP8_MAX * max(scale.scales)

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"data": attn_head_quantize(x, self.scale)}

    def decode(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        return attn_head_dequantize(parts["data"], self.scale, dtype)

    def beyond(self, x: torch.Tensor) -> torch.Tensor:
        return x.abs() > FP8_MAX * _heads(self.scale, x)

    def static_bytes(self) -> int:
        return 4 * len(self.scale.scales)


class FourOverSixCodec(NVFP4Codec):
    """vLLM's nvfp4_4over6: NVFP4Codec's layout, global scale and reading; only the store's block
    scales differ."""

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        codes, block_scale = nvfp4_4over6_quantize(x, self.scale)
        return {"data": pack(codes, 4), "scale": block_scale}


class ModelOptNVFP4Codec(Codec):
    """ModelOpt's NVFP4 KV fake quantization (nvfp4_cast: amax 448; nvfp4_rotate: K Hadamard-rotated
    first)."""

    static = True

    def __init__(self, amax: float, rotate: bool = False):
        self.amax, self.rotate = float(amax), rotate
        self.limit = self.amax  # block scales saturate at 448: 6 x 448 x amax / 2688

    def _rotated(self, x: torch.Tensor) -> torch.Tensor:
        return modelopt_hadamard(x) if self.rotate else x

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        codes, block_scale = modelopt_nvfp4_quantize(self._rotated(x), self.amax)
        return {"data": pack(codes, 4), "scale": block_scale}

    def decode(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        values = modelopt_nvfp4_dequantize(
            unpack(parts["data"], 4), parts["scale"], self.amax, dtype
        )
        return self._rotated(values)  # H is its own inverse: back to the basis of the unrotated Q

    def beyond(self, x: torch.Tensor) -> torch.Tensor:
        return self._rotated(x).abs() > self.limit


def variant_codecs(
    name: str, k_scale: KVScale | None, v_scale: KVScale | None
) -> tuple[Codec, Codec]:
    """K and V codecs of an engine variant; k_scale/v_scale: HeadScale (fp8_attn_head), the global
    scale amax/448 (nvfp4_4over6) or the amax of rotated K and of V (nvfp4_rotate)."""
    if name == "fp8_e5m2":
        return E5M2Codec(), E5M2Codec()
    if name == "nvfp4_cast":
        return ModelOptNVFP4Codec(MODELOPT_CONSTANT_AMAX), ModelOptNVFP4Codec(
            MODELOPT_CONSTANT_AMAX
        )
    if name == "fp8_attn_head":
        if not isinstance(k_scale, HeadScale) or not isinstance(v_scale, HeadScale):
            raise TrtkvError(
                "KV format fp8_attn_head needs per-KV-head K and V scales per layer (HeadScale; "
                f"got k={k_scale!r:.60}, v={v_scale!r:.60}). Next: pass "
                "KVScales.for_format('fp8_attn_head') from a calibration pass "
                "(trtkv.kvcache.scales.calibrate_scales)."
            )
        return AttnHeadCodec(k_scale), AttnHeadCodec(v_scale)
    if k_scale is None or v_scale is None or not (float(k_scale) > 0 and float(v_scale) > 0):
        raise TrtkvError(
            f"KV format {name} needs positive static K and V scales per layer (got k={k_scale}, "
            f"v={v_scale}). Next: pass k_scales/v_scales from KVScales.for_format('{name}')."
        )
    if name == "nvfp4_4over6":
        return FourOverSixCodec(float(k_scale)), FourOverSixCodec(float(v_scale))
    if name == "nvfp4_rotate":
        return ModelOptNVFP4Codec(float(k_scale), rotate=True), ModelOptNVFP4Codec(float(v_scale))
    raise TrtkvError(
        f"KV format variant {name!r} is unknown. Allowed: {', '.join(ENGINE_VARIANTS)}."
    )
