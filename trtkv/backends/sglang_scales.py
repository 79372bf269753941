"""The KV scales SGLang reads for the sglang backend: when trtkv hands calibrate's FP8 scales over
as --quantization-param-path JSON (FP8 KV without FP8 weights: SGLang's ModelOptFp8Config refuses a
ModelOpt config without `quant_algo`), that JSON document and its file, and the warning for NVFP4 KV
scales SGLang reads 6x too large on SM100.
"""

from __future__ import annotations

import json
from pathlib import Path

from trtkv.core.errors import StageError
from trtkv.engines.sglang import SGLANG_VERSION
from trtkv.platform.hardware import GPU, GPU_SPECS
from trtkv.recipe import KVCacheQuant, Recipe, WeightQuant
from trtkv.recipe.layout import HF

SCALES_FILE = "sglang_kv_scales.json"  # --quantization-param-path
# KVCacheQuantSchema.check_is_fp8 (python/sglang/srt/model_loader/weight_utils.py)
FP8_DTYPE = "float8_e4m3fn"


def nvfp4_scale_warning(recipe: Recipe) -> str | None:
    """NVFP4 KV on SM100: SGLang 0.5.23 multiplies a checkpoint k/v_scale by 6 there (it reads amax
    / (6 x 448); fp4_kv_cache_quant_method.py load_scales_from_model), but ModelOpt 0.47 exports
    amax / 448 (unified_export_hf.py)."""
    gpu = recipe.hardware.gpu
    if (
        recipe.quantization.kv_cache is not KVCacheQuant.NVFP4
        or gpu is GPU.CPU
        or not GPU_SPECS[gpu].nvfp4_kv
    ):
        return None
    sm = "".join(map(str, GPU_SPECS[gpu].sm))
    return (
        f"warning: SGLang {SGLANG_VERSION} on {gpu.value} (SM{sm}) multiplies the export's NVFP4 "
        "k_scale/v_scale by 6 (it expects amax / (6 x 448)), but ModelOpt 0.47 writes amax / 448: "
        "the KV global scale is 6x too large (block scales pushed toward E4M3's low end; "
        "docs/kv-formats.md, nvfp4 row). Measure it, or serve NVFP4 KV with build.backend llmapi "
        "(TensorRT-LLM reads amax / 448 as is)"
    )


def uses_scales_file(recipe: Recipe) -> bool:
    """FP8 KV without FP8 weights: the HF export carries k_scale/v_scale, but SGLang reads them only
    through ModelOptFp8Config (FP8 weights), so trtkv hands them over as --quantization-param-path
    JSON."""
    return (
        recipe.quantization.kv_cache is KVCacheQuant.FP8
        and recipe.quantization.weights is WeightQuant.NONE
    )


def quant_param_document(
    k_amax: list[float], v_amax: list[float], tp_size: int, model_type: str | None
) -> dict:
    """SGLang's --quantization-param-path JSON (QuantParamSchema / KVCacheQuantSchema,
    weight_utils.py, sglang 0.5.23): one FP8 scale per layer, shared by K and V
    (LlamaModel.load_kv_cache_scales sets k_scale = v_scale), the same for every TP rank (per-tensor
    over all heads): max(k_amax, v_amax) / 448."""
    from trtkv.kvcache.formats import FP8_MAX
    from trtkv.kvcache.scales import MIN_AMAX, f32

    if len(k_amax) != len(v_amax) or not k_amax:
        raise StageError(
            f"SGLang scales: {len(k_amax)} K and {len(v_amax)} V amaxes (need one of each per "
            "layer). Next: rerun `trtkv calibrate`."
        )
    layers = {
        i: f32(max(k, v, MIN_AMAX) / FP8_MAX)
        for i, (k, v) in enumerate(zip(k_amax, v_amax, strict=True))
    }
    return {
        "model_type": model_type,
        "kv_cache": {
            "dtype": FP8_DTYPE,
            "scaling_factor": {r: dict(layers) for r in range(tp_size)},
        },
    }


def write_scales_file(recipe: Recipe, ckpt: Path, out: Path) -> Path:
    """`out`/sglang_kv_scales.json from calibrate's kv_scales.json (model_type from the HF export's
    config.json)."""
    from trtkv.kvcache.scales import load_kv_scales

    source = ckpt / "kv_scales.json"
    if not source.is_file():
        raise StageError(
            f"build {recipe.name}: {source} is missing; SGLang needs its FP8 KV scales as "
            "--quantization-param-path JSON here (weights none). Next: `trtkv calibrate "
            f"{recipe.name}`."
        )
    scales = load_kv_scales(source, recipe.model.num_layers)
    try:
        model_type = json.loads((ckpt / HF / "config.json").read_text()).get("model_type")
    except (OSError, json.JSONDecodeError):
        model_type = None
    doc = quant_param_document(scales.k_amax, scales.v_amax, recipe.build.tp_size, model_type)
    path = out / SCALES_FILE
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return path
