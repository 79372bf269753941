"""What the calibrate modules share: the stage name, the per-layer result, the ModelOpt KV entries
and preset of a calibrated format (from its registry row)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import Field

from trtkv.contracts.artifacts import KVScaleLayer
from trtkv.kvcache.engines import load_table
from trtkv.recipe import KVCacheQuant, Recipe, layout
from trtkv.recipe.backend_rules import HF_EXPORT_ONLY
from trtkv.recipe.enums import kv_row

STAGE = "calibrate"
CHECKPOINT = layout.CHECKPOINT
# ModelOpt 0.47's KV quantizer entries, as data, by the storage a calibrated format calibrates as
# (its registry row's recipe.storage: fp8_attn_head is fp8's). fp8 and nvfp4 are its presets
# KV_QUANT_CFG_CHOICES["fp8"] / ["nvfp4"] (the registry's modelopt rows name them; read from
# ModelOpt at run time, this copy is only for --dry-run); int8 has no preset in 0.47: one per-tensor
# 8-bit integer entry.
KV_ENTRIES: dict[str, list[dict[str, Any]]] = {
    "fp8": [{"quantizer_name": "*[kv]_bmm_quantizer", "cfg": {"num_bits": [4, 3], "axis": None}}],
    "int8": [{"quantizer_name": "*[kv]_bmm_quantizer", "cfg": {"num_bits": 8, "axis": None}}],
    "nvfp4": [
        {
            "quantizer_name": "*[kv]_bmm_quantizer",
            "cfg": {
                "num_bits": [2, 1],
                "block_sizes": {-1: 16, "type": "dynamic", "scale_bits": [4, 3]},
            },
        }
    ],
}


def kv_quantizer_entries(kv: KVCacheQuant) -> list[dict[str, Any]]:
    """The KV quantizer entries calibrate appends for `kv` ([]: nothing calibrated)."""
    choice = kv_row(kv).choice
    return KV_ENTRIES.get(choice.storage, []) if choice.checkpoint_algo else []


def modelopt_kv_preset(kv: KVCacheQuant) -> str | None:
    """ModelOpt's KV_QUANT_CFG_CHOICES preset a calibrated format uses: the registry's modelopt
    value of the storage it calibrates as (None: nothing calibrated, or no preset: int8)."""
    choice = kv_row(kv).choice
    if choice.checkpoint_algo is None:
        return None
    return load_table().formats[choice.storage].engine_value("modelopt")


FP8_BASE_MEANING = (
    "every Linear's weight_quantizer and input_quantizer FP8 E4M3 (num_bits [4, 3]) per-tensor; "
    "lm_head, routers, embeddings disabled"
)
ATTN_HEAD_NOTE = (
    "KV cache fp8_attn_head: calibrated with ModelOpt's fp8 preset (per-layer amax) while a hook "
    "kept each (KV head, channel)'s |max|; hf/ then carries vLLM's per-head form "
    "(trtkv.calibrate.attn_head, "
    'llm-compressor strategy="attn_head"): config.json quantization_config compressed-tensors with '
    "kv_cache_scheme strategy attn_head, model.layers.{i}.self_attn.k_scale / v_scale float32 "
    "[num_kv_heads, 1, 1] = head amax / 448 in kv_attn_head_scales.safetensors; ModelOpt's "
    "per-layer k_proj.k_scale / v_proj.v_scale and hf_quant_config.json are removed (vLLM would "
    "load both into the same parameter). kv_scales.json keeps the per-layer values (the largest "
    "head's)."
)
PER_TENSOR_NOTE = (
    "KV cache fp8 with the weights as stored on vLLM: hf/ carries the per-layer scales in the "
    "per-tensor compressed-tensors form vLLM reads (trtkv.kvcache.attn_head): config.json "
    "quantization_config compressed-tensors with no weight groups and kv_cache_scheme strategy "
    "tensor, ModelOpt's self_attn.k_proj.k_scale / v_proj.v_scale = amax/448 kept; "
    "hf_quant_config.json removed (vLLM's ModelOpt loader refuses a KV-only one: \"Missing "
    "'quant_algo' in quantization config\")."
)
NO_KV_NOTE = (
    "KV cache unquantized (quantization.kv_cache none): config.json "
    "quantization.kv_cache_quant_algo is null, the rank files hold no kv_cache_scaling_factor, "
    "kv_scales.json lists no layers; the cache keeps K/V in the model dtype."
)


def engine_format_note(kv: KVCacheQuant) -> str | None:
    """What calibrate does for an engine format (schema.ENGINE_KV_FORMATS): nothing to calibrate,
    and why (None else)."""
    if kv_row(kv).choice.kind != "engine":
        return None
    if kv is KVCacheQuant.FP8_CAST:
        return (
            "KV cache fp8_cast (ModelOpt's default --kv_cache_qformat: FP8 E4M3 with scale 1.0): "
            "nothing to calibrate and no KV scales written (kv_cache_quant_algo null); the engine "
            "stores K/V as FP8 with scale 1.0 (vLLM --kv-cache-dtype fp8 without k_scale/v_scale)."
        )
    return (
        f"KV cache {kv.value}: nothing to calibrate. Its scales are computed by the engine from "
        "the data at run time (see docs/kv-formats.md), so the export carries no KV quantization "
        "(kv_cache_quant_algo null) and the engine's own flag selects the format."
    )


# model.architecture values calibrate exports (ModelOpt's decoder types it was run on here); those
# in trtkv.recipe.backend_rules.HF_EXPORT_ONLY get the HF export alone (no TensorRT-LLM checkpoint).
CALIBRATED_ARCHITECTURES = ("llama", "gemma3")
DWARF_RATIO = 4.0  # a layer whose amax exceeds 4x the median layer amax

# (model, tokenizer) for a recipe; injectable so tests run the same path on a tiny model.
ModelLoader = Callable[[Recipe], tuple[Any, Any]]


def trtllm_export_refused(recipe: Recipe) -> str | None:
    """Why ModelOpt writes no TensorRT-LLM checkpoint for this recipe's architecture (None: it
    does)."""
    return HF_EXPORT_ONLY.get(recipe.model.architecture.lower())


class LayerScales(KVScaleLayer):
    """One layer as calibration measured it: its kv_scales.json record (KVScaleLayer; the file is
    built by trtkv.kvcache.scales.kv_scales_document from the amaxes) plus the per-channel |max| the
    report's warnings and the per-head export need."""

    k_channel_amax: list[float] = Field(default_factory=list)  # per (kv head, channel), flattened
    v_channel_amax: list[float] = Field(default_factory=list)
    head_dim: int = 1
