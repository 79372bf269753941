"""What `trtkv calibrate` would run, as data and lines (`--dry-run`, and `trtkv build --dry-run`):
no heavy imports."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from trtkv.calibrate.common import (
    CALIBRATED_ARCHITECTURES,
    FP8_BASE_MEANING,
    engine_format_note,
    kv_quantizer_entries,
    modelopt_kv_preset,
    trtllm_export_refused,
)
from trtkv.recipe import KVCacheQuant, ModelDtype, Recipe, WeightQuant, kv_only_compressed_tensors
from trtkv.recipe.backend_rules import HF_EXPORT_BACKENDS
from trtkv.recipe.enums import kv_algo
from trtkv.recipe.layout import checkpoint_dir
from trtkv.recipe.rules import kv_heads_split

if TYPE_CHECKING:
    pass


# ---------------------------------------------------------------------------------------------
# What would run (no heavy imports): used by --dry-run here and by `trtkv build --dry-run`.


def supported_problems(recipe: Recipe) -> list[str]:
    """Recipe settings this stage cannot calibrate, each with its next step."""
    q, b, m = recipe.quantization, recipe.build, recipe.model
    out = []
    if q.weights not in (WeightQuant.FP8, WeightQuant.NONE):
        out.append(
            f"quantization.weights = {q.weights.value!r}: trtkv calibrate exports fp8 or none "
            "weights. Next: use one of those, or ModelOpt's examples/llm_ptq/hf_ptq.py for "
            f"{q.weights.value}."
        )
    if m.dtype is ModelDtype.FLOAT32:
        out.append(
            "model.dtype = 'float32': ModelOpt's TensorRT-LLM export writes float16 or bfloat16 "
            "only (it falls back to float16). Next: use bfloat16 (or float16)."
        )
    if m.architecture.lower() not in CALIBRATED_ARCHITECTURES:
        out.append(
            f"model.architecture = {m.architecture!r}: trtkv calibrate exports "
            f"{', '.join(CALIBRATED_ARCHITECTURES)} (the ModelOpt decoder types run and validated "
            "here). Next: use one of those, or ModelOpt's examples/llm_ptq/hf_ptq.py for this "
            "model."
        )
    if trtllm_export_refused(recipe):
        if q.kv_cache is KVCacheQuant.INT8:
            out.append(
                f"quantization.kv_cache = 'int8' with model.architecture {m.architecture!r}: "
                "nothing could carry the scales (ModelOpt 0.47 writes no TensorRT-LLM checkpoint "
                "for it, and its HF export asserts on INT8 KV). Next: use fp8 (vLLM "
                "--kv-cache-dtype fp8) or none."
            )
        if m.dtype is ModelDtype.FLOAT16:
            out.append(
                f"model.dtype = 'float16' with model.architecture {m.architecture!r}: Gemma's "
                "activations overflow float16 (its 16-bit baseline is bfloat16). Next: use "
                "bfloat16."
            )
    if m.num_kv_heads is not None and not kv_heads_split(m.num_kv_heads, b.tp_size):
        out.append(
            f"build.tp_size = {b.tp_size} neither divides nor is a multiple of model.num_kv_heads "
            f"= {m.num_kv_heads} (ModelOpt's export splits KV heads or replicates them)."
        )
    if m.num_layers is not None and m.num_layers % b.pp_size:
        out.append(
            f"build.pp_size = {b.pp_size} does not divide model.num_layers = {m.num_layers} "
            f"(ModelOpt's PP split asserts on it)."
        )
    return out


def passes_on(recipe: Recipe) -> bool:
    """A pre-quantized checkpoint whose KV cache takes no scales: calibrate passes it on as stored
    (trtkv.calibrate.as_stored), nothing calibrated or exported, so ModelOpt's limits
    (supported_problems) do not apply."""
    return bool(recipe.model.checkpoint_quant) and recipe.kv_row.choice.checkpoint_algo is None


def stored_problems(recipe: Recipe) -> list[str]:
    """Where calibrate would refuse the recipe's stored checkpoint before any work
    (trtkv.calibrate.stored_kv: KV scales already carried, weights trtkv does not dequantize, an
    engine that reads no KV scale beside them), read from the folder's config when it is on this
    machine; nothing for a 16-bit checkpoint or one not found here."""
    if not recipe.model.checkpoint_quant:
        return []
    from trtkv.calibrate.stored_kv import stored_checkpoint
    from trtkv.checkpoints import local_model_dir
    from trtkv.core.errors import StageError

    model_dir = local_model_dir(recipe)
    if model_dir is None:
        return []
    try:
        stored_checkpoint(recipe, model_dir)
    except StageError as exc:
        return [str(exc)]
    return []


def quantizes(recipe: Recipe) -> bool:
    """Whether ModelOpt quantizes anything (weights none + kv_cache none: a plain export in the
    model dtype)."""
    q = recipe.quantization
    return q.weights is WeightQuant.FP8 or kv_algo(q.kv_cache) is not None


def modelopt_config_spec(recipe: Recipe) -> dict[str, Any]:
    """The ModelOpt quantization config as data: the base config's name plus the KV entries appended
    to it."""
    base = "mtq.FP8_DEFAULT_CFG" if recipe.quantization.weights is WeightQuant.FP8 else None
    kv = recipe.quantization.kv_cache
    if not quantizes(recipe):
        return {
            "base": None,
            "base_meaning": "nothing to quantize (weights none, kv_cache none): mtq.quantize is "
            "not called; plain export in the model dtype",
            "kv_entries": [],
            "algorithm": None,
        }
    if not kv_algo(kv):  # none, or an engine format (nothing to calibrate)
        return {
            "base": base,
            "base_meaning": FP8_BASE_MEANING,
            "kv_entries": [],
            "kv_source": "none: kv_cache none, no KV entries; the base's {'quantizer_name': '*', "
            "'enable': False} leaves the k/v_bmm_quantizers disabled (KV cache unquantized)",
            "algorithm": "max",
        }
    return {
        "base": base,
        "base_meaning": (
            FP8_BASE_MEANING
            if base
            else "no weight quantization: quant_cfg starts with {'quantizer_name': '*', 'enable': "
            "False}"
        ),
        "kv_entries": kv_quantizer_entries(kv),
        "kv_source": (
            f"modelopt.recipe.presets.KV_QUANT_CFG_CHOICES['{preset}']"
            if (preset := modelopt_kv_preset(kv))
            else f"hand entry (no {kv.value.upper()} KV preset in ModelOpt 0.47)"
        ),
        "combined_with": "modelopt.torch.quantization.utils.update_quant_cfg_with_kv_cache_quant",
        "algorithm": "max",
    }


ATTN_HEAD_HF = (
    "hf/ (export_hf_checkpoint, then trtkv.calibrate.attn_head: config.json quantization_config "
    "compressed-tensors with kv_cache_scheme strategy attn_head, kv_attn_head_scales.safetensors "
    "with model.layers.{i}.self_attn.k_scale / v_scale float32 [num_kv_heads, 1, 1] = head "
    "amax/448; ModelOpt's per-layer k_proj.k_scale / v_proj.v_scale and hf_quant_config.json "
    "removed)"
)


PER_TENSOR_HF = (
    "hf/ (export_hf_checkpoint, then trtkv.kvcache.attn_head.write_per_tensor_scheme: config.json "
    "quantization_config compressed-tensors, no weight groups, kv_cache_scheme strategy tensor; "
    "ModelOpt's per-layer k_proj.k_scale / v_proj.v_scale = amax/448 kept, hf_quant_config.json "
    "removed: what vLLM reads with the weights as stored)"
)


# model.checkpoint_quant: the weights as stored (trtkv.calibrate.stored_kv)
STORED_KV = (
    "  KV cache only: the weights stored as {fmt} (model.checkpoint_quant) are dequantized in "
    "memory as stored (ModelOpt's FP8QTensor / NVFP4QTensor) for the K/V amax, never quantized "
    "again; the scales go where the checkpoint's engine reads them beside those weights (ModelOpt: "
    "self_attn.k_proj.k_scale, hf_quant_config.json kv_cache_quant_algo FP8; compressed-tensors: "
    "kv_cache_scheme, self_attn.k_scale); refused before any work where none reads them"
)
AS_STORED = (
    "  Served as stored: kv_cache {kv} takes no KV scales, so nothing is calibrated or quantized; "
    "hf/ is the checkpoint stored as {fmt} (model.checkpoint_quant), its safetensors shards "
    "hard-linked, unchanged (trtkv.calibrate.as_stored); tokenizer/, kv_scales.json (no layers), "
    "calibration_report.md"
)
STORED_HF = (
    "hf/ (the checkpoint's own safetensors shards hard-linked, unchanged, + "
    "kv_cache_scales.safetensors listed in model.safetensors.index.json + the config declaring "
    "the KV scheme); no TensorRT-LLM checkpoint; tokenizer/, kv_scales.json, calibration_report.md"
)


def reads_hf(recipe: Recipe) -> bool:
    """Whether the recipe's backend serves hf/ (not the TensorRT-LLM checkpoint)."""
    return recipe.build.backend in HF_EXPORT_BACKENDS


def export_targets(recipe: Recipe) -> dict[str, str]:
    """What the stage writes, file by file, each saying whether build.backend reads it."""
    b, kv = recipe.build, recipe.quantization.kv_cache
    ranks = ", ".join(f"rank{r}.safetensors" for r in range(recipe.world_size))
    if kv is KVCacheQuant.FP8_ATTN_HEAD:
        hf = ATTN_HEAD_HF
    elif kv_only_compressed_tensors(recipe):
        hf = PER_TENSOR_HF
    elif kv is KVCacheQuant.FP8:
        hf = "hf/ (export_hf_checkpoint: hf_quant_config.json, k_scale/v_scale = amax/448)"
    elif kv is KVCacheQuant.NVFP4:
        hf = (
            "hf/ (export_hf_checkpoint: hf_quant_config.json kv_cache_quant_algo NVFP4, per-layer "
            "K and V global scales; calibration needs CUDA)"
        )
    elif not kv_algo(kv):  # none, or an engine format: no KV quantization in the export
        hf = (
            "hf/ (export_hf_checkpoint: hf_quant_config.json quant_algo FP8, kv_cache_quant_algo "
            "null, no k_scale/v_scale)"
            if recipe.quantization.weights is WeightQuant.FP8
            else f"hf/ (export_hf_checkpoint: a plain HF checkpoint in {recipe.model.dtype.value}, "
            "no hf_quant_config.json)"
        )
    else:
        hf = (
            "hf/: not written (ModelOpt 0.47's export_hf_checkpoint asserts on INT8 KV: 'Invalid "
            "KV cache quantization format'); the report says so"
        )
    refused = trtllm_export_refused(recipe)
    kv_scales = (
        "kv_scales.json (per layer k/v amax, kv_cache_scaling_factor, k_scale, v_scale)"
        if kv_algo(kv)
        else 'kv_scales.json ({"kv_cache_quant_algo": null, "num_layers": N, "layers": []})'
    )
    backend = b.backend.value
    trtllm = (
        f"not written for model.architecture {recipe.model.architecture!r}: {refused}"
        if refused
        else f"config.json + {ranks} (export_tensorrt_llm_checkpoint(model, "
        f"{recipe.model.architecture!r}, torch.{recipe.model.dtype.value}, dir, "
        f"inference_tensor_parallel={b.tp_size}, inference_pipeline_parallel={b.pp_size}))"
    )
    hf_read = reads_hf(recipe) and not hf.startswith("hf/: not written")
    targets = {"hf": f"{hf}; build.backend {backend} serves it"} if hf_read else {}
    if reads_hf(recipe) and not refused:
        trtllm = (
            f"{trtllm}; also written, not read by build.backend {backend} (the TensorRT-LLM "
            "backends' input)"
        )
    elif not reads_hf(recipe) and not refused:
        trtllm = f"{trtllm}; build.backend {backend} reads it"
    return {
        **targets,
        "tensorrt_llm": trtllm,
        "hf": targets.get("hf", hf),
        "tokenizer": "tokenizer/ (the model's tokenizer files)",
        "kv_scales": kv_scales,
        "report": (
            "calibration_report.md (per-layer table, warnings, K/V statistics)"
            if kv_algo(kv)
            else "calibration_report.md (says the KV cache is unquantized; K/V statistics)"
        ),
    }


def describe_calibration(recipe: Recipe) -> list[str]:
    """Lines saying what `trtkv calibrate` would do for this recipe (no heavy imports, writes
    nothing)."""
    c, q = recipe.calibration, recipe.quantization
    out = checkpoint_dir(recipe)
    if passes_on(recipe):
        fmt = recipe.model.checkpoint_quant
        return [
            f"calibrate {recipe.name}: nothing to calibrate on {recipe.model.source}",
            AS_STORED.format(kv=q.kv_cache.value, fmt=fmt),
            f"  output: {out}/",
        ] + [f"  cannot run: {p}" for p in stored_problems(recipe)]
    batches = -(-c.num_samples // c.batch_size)
    kv_algo = recipe.kv_row.choice.checkpoint_algo
    what = (
        "ModelOpt mtq.quantize (max calibration)"
        if quantizes(recipe)
        else "no quantization (weights none, kv_cache none), plain export"
    )
    lines = [
        f"calibrate {recipe.name}: {what} on {recipe.model.source}",
        f"  data: {c.dataset}: {c.num_samples} samples x {c.seq_len} tokens = "
        f"{c.num_samples * c.seq_len} tokens, batch {c.batch_size} ({batches} forward passes), "
        f"seed {c.seed}",
        f"  ModelOpt config: {json.dumps(modelopt_config_spec(recipe))}",
    ]
    if recipe.model.checkpoint_quant:
        lines.append(STORED_KV.format(fmt=recipe.model.checkpoint_quant))
    elif q.kv_cache is KVCacheQuant.FP8_ATTN_HEAD:
        lines.append(
            "  KV cache: fp8_attn_head -> calibrated as FP8 (per-layer amax) with each (KV head, "
            "channel)'s |max| recorded; hf/ per (layer, KV head) self_attn.k_scale / v_scale = "
            "head amax/448, shape [num_kv_heads, 1, 1], under a compressed-tensors kv_cache_scheme "
            "(strategy attn_head): what vLLM --kv-cache-dtype fp8 loads per head (FlashAttention "
            ">= 3)"
        )
    elif kv_algo == "NVFP4":
        lines.append(
            "  KV cache: NVFP4 -> hf/hf_quant_config.json kv_cache_quant_algo = NVFP4, per-layer "
            "self_attn.k_proj.k_scale = k_amax/448 and v_proj.v_scale = v_amax/448 (separate K and "
            "V global scales; the per-16 E4M3 block scales are computed at run time). Served "
            "through the LLM API (kv_cache_config.dtype nvfp4) on Blackwell; ModelOpt's NVFP4 KV "
            "forward needs CUDA"
        )
    elif kv_only_compressed_tensors(recipe):
        lines.append(
            "  KV cache: FP8 -> hf/config.json quantization_config compressed-tensors with "
            "kv_cache_scheme strategy tensor (no weight groups: the weights as stored), per-layer "
            "self_attn.k_proj.k_scale = k_amax/448 and v_proj.v_scale = v_amax/448: what vLLM "
            "--kv-cache-dtype fp8 loads per tensor (its ModelOpt loader refuses a KV-only "
            "hf_quant_config.json)"
        )
    elif kv_algo and (trtllm_export_refused(recipe) or reads_hf(recipe)):
        sliding = (
            ", sliding and full" if "sliding" in str(recipe.model.attention_layers or "") else ""
        )
        lines.append(
            f"  KV cache: {kv_algo} -> hf/hf_quant_config.json kv_cache_quant_algo = {kv_algo}, "
            "per-layer self_attn.k_proj.k_scale = k_amax/448 and self_attn.v_proj.v_scale = "
            f"v_amax/448 for every layer{sliding}, what build.backend {recipe.build.backend.value} "
            f"reads{'; no TensorRT-LLM checkpoint' if trtllm_export_refused(recipe) else ''}"
        )
    elif kv_algo:
        factor = (
            "max(k_amax, v_amax)/127"
            if kv_algo == "INT8"
            else "max(k_amax, v_amax)/448, clamped to >= 1.0"
        )
        lines.append(
            f"  KV cache: {kv_algo} -> checkpoint config.json quantization.kv_cache_quant_algo = "
            f"{kv_algo}, per-layer transformer.layers.{{i}}.attention.kv_cache_scaling_factor = "
            f"{factor} (trtllm-build has no --{q.kv_cache.value}_kv_cache flag)"
        )
    elif engine_format_note(q.kv_cache):
        lines.append(f"  {engine_format_note(q.kv_cache)}")
    else:
        lines.append(
            "  KV cache: unquantized -> checkpoint config.json quantization.kv_cache_quant_algo = "
            "null, no kv_cache_scaling_factor tensors (K/V statistics are still collected for the "
            "report)"
        )
    lines.append(f"  output: {out}/")
    if recipe.model.checkpoint_quant:
        lines.append(f"    hf: {STORED_HF}")
    else:
        lines += [f"    {name}: {what}" for name, what in export_targets(recipe).items()]
    lines += [f"  cannot run: {p}" for p in supported_problems(recipe) + stored_problems(recipe)]
    return lines
