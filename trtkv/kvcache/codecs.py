"""One codec per stored K or V format: turns a chunk of tokens ([batch, kv_heads, tokens, head_dim])
into stored parts (packed codes plus float16 scales and zero points, token axis at dim -2) and back;
layer_codecs picks the pair for a layer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from trtkv.core.errors import TrtkvError
from trtkv.kvcache.codec_base import Codec, NVFP4Codec
from trtkv.kvcache.formats import (
    FP8_MAX,
    INT8_MAX,
    SPECS,
    TURBOQUANT_PRESETS,
    KVFormat,
)
from trtkv.kvcache.names import KIVI_GROUP, KIVI_RESIDUAL, FormatChoice, parse_format
from trtkv.kvcache.numerics import (
    AffineScale,
    KVScale,
    asym_dequantize,
    asym_quantize,
    bias4,
    fp8_affine_dequantize,
    fp8_affine_quantize,
    fp8_dequantize,
    fp8_quantize,
    int4_per_token_head_dequantize,
    int4_per_token_head_quantize,
    int8_static_dequantize,
    int8_static_quantize,
    int8_token_dequantize,
    int8_token_quantize,
    pack,
    per_token_head_quantize,
    unpack,
)
from trtkv.kvcache.turboquant import (
    pack_bits,
    turboquant_key_dequantize,
    turboquant_key_quantize,
    turboquant_value_quantize,
    ultraquant_dequantize,
    ultraquant_quantize,
    unpack_bits,
)

# ----------------------------------------------------------------------------- codecs


class CastCodec(Codec):
    elementwise = True

    def __init__(self, storage: torch.dtype):
        self.storage = storage

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"data": x.to(self.storage)}

    def decode(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        return parts["data"].to(dtype)


class StaticCodec(Codec):
    """One static scale per layer: FP8 E4M3 codes of x / scale, or TensorRT-LLM's INT8 ones
    (`int8`); clips beyond the largest code times the scale."""

    static = True
    elementwise = True

    def __init__(self, scale: float, int8: bool = False):
        self.scale, self.int8 = float(scale), int8
        self.limit = (INT8_MAX if int8 else FP8_MAX) * self.scale

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        quantize = int8_static_quantize if self.int8 else fp8_quantize
        return {"data": quantize(x, self.scale)}

    def decode(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        dequantize = int8_static_dequantize if self.int8 else fp8_dequantize
        return dequantize(parts["data"], self.scale, dtype)


class FP8AffineCodec(Codec):
    """ModelOpt's fp8_affine: E4M3 of x - bias with a static amax; clips where |x - bias| exceeds
    the amax."""

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
        return (x - bias4(self.bias, x)).abs() > self.limit

    def static_bytes(self) -> int:
        # the amax and the bias (ModelOpt: model dtype)
        return 4 + self.bias.numel() * self.bias.element_size()


class Int8TokenCodec(Codec):
    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        q, scale = int8_token_quantize(x)
        return {"data": q, "scale": scale}

    def decode(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        return int8_token_dequantize(parts["data"], parts["scale"], dtype)


class PerTokenHeadCodec(Codec):
    """vLLM's int8_per_token_head / fp8_per_token_head: a float32 scale per (token, head) from the
    data."""

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
    """vLLM's int4_per_token_head: rotated, asymmetric uint4 packed two per byte, zp inside the
    float32 scale."""

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        if x.shape[-1] % 2:
            raise TrtkvError(
                f"int4_per_token_head packs two values per byte; head_dim {x.shape[-1]} is odd."
            )
        q, scale = int4_per_token_head_quantize(x)
        return {"data": pack(q, 4), "scale": scale}

    def decode(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        return int4_per_token_head_dequantize(unpack(parts["data"], 4), parts["scale"], dtype)


class TurboQuantKeyCodec(Codec):
    """TurboQuant's keys: FP8 E4M3 with scale 1 (key bits 8) or Hadamard + Lloyd-Max codes and a
    float16 norm."""

    def __init__(self, bits: int, norm_correction: bool):
        self.bits, self.norm_correction = bits, norm_correction
        self.row_separable = bits == 8  # the codes' decode is a GEMM with the Hadamard matrix

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.bits == 8:
            return {"data": fp8_quantize(x, 1.0)}
        idx, norm = turboquant_key_quantize(x, self.bits)
        return {"data": pack_bits(idx, self.bits), "norm": norm}

    def decode(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        if self.bits == 8:
            return fp8_dequantize(parts["data"], 1.0, dtype)
        idx = unpack_bits(parts["data"], self.bits)
        return turboquant_key_dequantize(idx, parts["norm"], self.bits, self.norm_correction, dtype)


class TurboQuantValueCodec(Codec):
    """TurboQuant's values: uniform b-bit per (token, head), float16 scale and zero (the min)."""

    def __init__(self, bits: int):
        self.bits = bits

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        q, scale, zero = turboquant_value_quantize(x, self.bits)
        return {"data": pack_bits(q, self.bits), "scale": scale, "zero": zero}

    def decode(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        q = unpack_bits(parts["data"], self.bits).float()
        return (q * parts["scale"].float() + parts["zero"].float()).to(dtype)


class UltraQuantCodec(Codec):
    """vLLM's ultraquant_4bit for K (rotated) or V: FP4 codes two per byte, one UE8M0 byte per 32
    elements."""

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
        return asym_dequantize(
            unpack(parts["data"], self.bits), parts["scale"], parts["zero"], dtype
        )


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
        return {
            "data": pack(codes, self.bits),
            "scale": scale.squeeze(-1),
            "zero": zero.squeeze(-1),
        }

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


# (format as written, K scale, V scale) -> the layer's codecs
CodecFactory = Callable[[FormatChoice, float | None, float | None], LayerCodecs]


def _scaled(make: Callable[[float], Codec], shared: bool = False) -> CodecFactory:
    """Codecs of positive static K and V scales per layer (`shared`: TensorRT-LLM's one
    kv_cache_scaling_factor for K and V, max of the two, unless the format splits them)."""

    def factory(choice: FormatChoice, k: float | None, v: float | None) -> LayerCodecs:
        if k is None or v is None or not (k > 0 and v > 0):
            raise TrtkvError(
                f"KV format {choice.name} needs positive static K and V scales per layer (NVFP4: "
                f"global scales, amax/448; got k={k}, v={v}). Next: pass k_scales/v_scales "
                "(kv_scales.json) or calibrate them with trtkv.kvcache.scales.calibrate_scales("
                "model, tokenizer) (KVScales.for_format)."
            )
        if shared and not choice.split_scales:
            k = v = max(k, v)
        return LayerCodecs(make(k), make(v))

    return factory


def _pair(make: Callable[[], Codec]) -> CodecFactory:
    return lambda choice, k, v: LayerCodecs(make(), make())


def _grouped(choice: FormatChoice, k: float | None, v: float | None) -> LayerCodecs:
    spec = SPECS[choice.base]
    if choice.codec.startswith("kivi"):  # K per channel over token groups, a full-precision window
        group = spec.group_size or KIVI_GROUP
        key: Codec = KiviKeyCodec(spec.bits, group)
        return LayerCodecs(key, GroupAsymCodec(spec.bits, group), residual=KIVI_RESIDUAL)
    group = spec.group_size or 64
    return LayerCodecs(GroupAsymCodec(spec.bits, group), GroupAsymCodec(spec.bits, group))


def _turboquant(choice: FormatChoice, k: float | None, v: float | None) -> LayerCodecs:
    key_bits, value_bits, norm = TURBOQUANT_PRESETS[KVFormat(choice.codec)]
    return LayerCodecs(TurboQuantKeyCodec(key_bits, norm), TurboQuantValueCodec(value_bits))


# The codecs by name: a registry row's storage.codec (its own name unless it says another) picks
# one, so a new format row that stores like an existing one names that codec and needs no code.
CODECS: dict[str, CodecFactory] = {
    "fp16": _pair(lambda: CastCodec(torch.float16)),
    "bf16": _pair(lambda: CastCodec(torch.bfloat16)),
    "fp8_scale1": _pair(lambda: StaticCodec(1.0)),
    "fp8": _scaled(StaticCodec),
    "int8": _scaled(lambda scale: StaticCodec(scale, int8=True), shared=True),
    "nvfp4": _scaled(NVFP4Codec),  # separate K and V global scales, as TensorRT-LLM
    "int8_token": _pair(Int8TokenCodec),
    "int8_per_token_head": _pair(lambda: PerTokenHeadCodec(fp8=False)),
    "fp8_per_token_head": _pair(lambda: PerTokenHeadCodec(fp8=True)),
    "int4_per_token_head": _pair(Int4PerTokenHeadCodec),
    "ultraquant_4bit": lambda choice, k, v: LayerCodecs(
        UltraQuantCodec(rotate=True), UltraQuantCodec(rotate=False)
    ),
    **{f.value: _turboquant for f in TURBOQUANT_PRESETS},
    **{name: _grouped for name in ("int4_g32", "int4_g64", "int4_g128", "kivi4", "kivi2")},
}


def layer_codecs(
    fmt: KVFormat | str | FormatChoice,
    k_scale: KVScale | None = None,
    v_scale: KVScale | None = None,
) -> LayerCodecs:
    """The codecs of one layer for a format (its registry row's codec); static formats take that
    layer's scales (multipliers; fp8_affine its AffineScale of K and of V)."""
    choice = parse_format(fmt)
    if choice.affine:
        if not isinstance(k_scale, AffineScale) or not isinstance(v_scale, AffineScale):
            raise TrtkvError(
                f"KV format {choice.name} needs each layer's K and V amax and bias (AffineScale; "
                f"got k={k_scale!r:.60}, v={v_scale!r:.60}). Next: calibrate them with "
                f"trtkv.kvcache.scales.calibrate_scales(model, tokenizer) and pass "
                f"KVScales.for_format('{choice.name}')."
            )
        return LayerCodecs(FP8AffineCodec(k_scale), FP8AffineCodec(v_scale))
    if choice.variant:
        from trtkv.kvcache.variants import variant_codecs

        return LayerCodecs(*variant_codecs(choice.variant, k_scale, v_scale))
    factory = CODECS.get(choice.codec)
    if factory is None:
        raise TrtkvError(
            f"KV format {choice.name}: its registry row names codec {choice.codec!r}, which "
            f"trtkv.kvcache.codecs has not. Allowed: {', '.join(CODECS)}. Next: name one of "
            "them in the row's storage.codec, or add the codec to CODECS."
        )
    k = None if k_scale is None else float(k_scale)
    v = None if v_scale is None else float(v_scale)
    return factory(choice, k, v)
