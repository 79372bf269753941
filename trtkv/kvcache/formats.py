"""The KV-cache formats trtkv knows, and the storage each one costs per token.

The format names and their storage facts come from the registry (trtkv/data/kv_formats.json via
trtkv.kvcache.engines); this module holds the bytes-per-token formula used by the planner (`trtkv
plan`), the quantized cache and the probe.
It imports nothing heavy: the CLI uses it at start-up.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum, EnumMeta
from typing import TYPE_CHECKING

from trtkv.kvcache.engines import Storage, load_table

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


# The storage formats: the registry's rows with a storage block (trtkv/data/kv_formats.json),
# members named by their value upper-cased (KVFormat.FP8_SCALE1 = "fp8_scale1").
if TYPE_CHECKING:

    class _Members(EnumMeta):
        def __getattr__(cls, name: str) -> KVFormat: ...

    class KVFormat(str, Enum, metaclass=_Members):
        """How K and V are stored in the cache."""

else:
    KVFormat = Enum(
        "KVFormat",
        {r.name.upper(): r.name for r in load_table().storage_rows()},
        type=str,
        module=__name__,
    )
    KVFormat.__doc__ = "How K and V are stored in the cache (one per registry row with storage)."

# Numeric facts about each format: its registry row's storage block
SPECS: dict[KVFormat, Storage] = {
    KVFormat(r.name): r.storage for r in load_table().storage_rows() if r.storage
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


def stored_as(fmt: KVFormat | str) -> KVFormat:
    """The storage format whose codec `fmt` runs (its row's storage.codec; itself unless the row
    names another): what its bytes per token follow."""
    return KVFormat(SPECS[KVFormat(fmt)].codec)


def slot_bytes(fmt: KVFormat | str, head_dim: int) -> int:
    """Bytes of one packed K+V slot per (token, KV head), as vLLM allocates it
    (TurboQuantConfig.slot_size_aligned: K bytes + V bytes rounded up to even; UltraQuant's
    format.slot_size: codes + one UE8M0 byte per 32, K and V)."""
    fmt = stored_as(fmt)
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
    if stored_as(fmt) not in PACKED_SLOT or num_layers <= 0:
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
    fmt = stored_as(fmt)
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
    fmt = stored_as(fmt)
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
