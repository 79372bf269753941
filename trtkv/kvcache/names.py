"""KV format names as users and engines write them: trtkv's formats, their variants (int8_split,
fp8_affine) and engine aliases (fp8_cast), resolved to the storage they share (FormatChoice)."""

from __future__ import annotations

from dataclasses import dataclass

from trtkv.core.errors import TrtkvError
from trtkv.kvcache.engines import load_table
from trtkv.kvcache.formats import SPECS, KVFormat

FP16_MAX = 65504.0
KIVI_GROUP = 32
KIVI_RESIDUAL = 128

# Variants: extra names the probe and the cache accept, mapped to the KVFormat whose storage they
# share.
VARIANTS: dict[str, KVFormat] = {"int8_split": KVFormat.INT8, "fp8_affine": KVFormat.FP8}
AFFINE = ("fp8_affine",)  # variants with a calibrated zero point (bias) per (KV head, channel)
MODELOPT_AMAX_EPS = 1.0 / (1 << 24)  # _fp8_eager: an amax at or below this quantizes with amax 1
# Aliases: engine names with exactly the numerics of a trtkv format, from the registry rows' aliases
# (int8_token is NOT int8_per_token_head: it keeps a float16 scale, rounds half to even and clamps
# to [-127, 127]; see trtkv/data/kv_formats.json).
ALIASES: dict[str, KVFormat] = {
    alias: KVFormat(row.name) for row in load_table().storage_rows() for alias in row.aliases
}
# Engine variants with numerics of their own on a trtkv storage (codecs in trtkv.kvcache.variants):
# the base is what they cost per token; UNSCALED ones take no calibrated scales.
ENGINE_VARIANTS: dict[str, KVFormat] = {
    "fp8_e5m2": KVFormat.FP8_SCALE1,
    "fp8_attn_head": KVFormat.FP8,
    "nvfp4_4over6": KVFormat.NVFP4,
    "nvfp4_rotate": KVFormat.NVFP4,
    "nvfp4_cast": KVFormat.NVFP4,
}
UNSCALED_VARIANTS = ("fp8_e5m2", "nvfp4_cast")
PER_TOKEN_HEAD_MIN_SCALE = 1e-6  # vLLM's floor on a per-token-head scale (all-zero heads)
# vLLM's int4_per_token_head sign vector: torch.Generator seed, bernoulli(0.5) -> +-1
RHT_SEED = 0x9E3779B9
# Codecs (a storage row's codec, trtkv.kvcache.codecs.CODECS) with one static scale per layer, and
# those of them that take calibrated scales (fp8_scale1's is the constant 1.0)
STATIC_CODECS = ("fp8", "fp8_scale1", "int8", "nvfp4")
SCALED_CODECS = ("fp8", "int8", "nvfp4")
# E2M1 magnitudes by 3-bit code (exponent 2 bits, mantissa 1 bit, bias 1; code 1 is the subnormal
# 0.5)
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


@dataclass(frozen=True)
class FormatChoice:
    """A format name as the user wrote it, the KVFormat it stores as, and whether int8 K/V scales
    are split."""

    name: str
    base: KVFormat
    split_scales: bool = False
    affine: bool = False
    variant: str = ""  # an ENGINE_VARIANTS name: its own codecs (trtkv.kvcache.variants)

    @property
    def static(self) -> bool:
        return self.codec in STATIC_CODECS

    @property
    def needs_scales(self) -> bool:
        return self.codec in SCALED_CODECS and self.variant not in UNSCALED_VARIANTS

    @property
    def codec(self) -> str:
        """The codec of the storage row (its registry row's storage.codec)."""
        return SPECS[self.base].codec


def all_format_names() -> list[str]:
    names = [f.value for f in KVFormat]
    return names + [v for v in (*VARIANTS, *ALIASES, *ENGINE_VARIANTS) if v not in names]


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
    if name in ENGINE_VARIANTS:
        return FormatChoice(name, ENGINE_VARIANTS[name], variant=name)
    try:
        return FormatChoice(name, KVFormat(name))
    except ValueError:
        raise TrtkvError(
            f"KV format {fmt!r} is unknown. Allowed: {', '.join(all_format_names())}."
        ) from None
