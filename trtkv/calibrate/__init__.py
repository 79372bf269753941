"""The calibrate stage: ModelOpt calibration of KV scales (and FP8 weights), exported for TensorRT-LLM and HF.

recipe -> engines/<recipe>/checkpoint/:
  config.json + rank{r}.safetensors   TensorRT-LLM checkpoint (export_tensorrt_llm_checkpoint, tp/pp from the recipe)
  hf/                                 HF checkpoint (export_hf_checkpoint; FP8 or no KV: ModelOpt 0.47 asserts on INT8)
  tokenizer/                          the model's tokenizer, for downstream stages
  hf_config.json                      the model's HF config.json (build reads it: an INT8-KV checkpoint has no hf/)
  kv_scales.json                      per layer k/v amax, TensorRT-LLM factor, vLLM k_scale/v_scale (byte-stable);
                                      kv_cache none: kv_cache_quant_algo null and no layers
  calibration_report.md               per-layer table, warnings, K/V statistics
  manifest.json                       stage contract (trtkv.contracts.stage.run_stage)
Heavy imports (torch, transformers, modelopt) happen inside the functions that need them. Modules: common (shared
names), describe (the dry run), modelopt_export (quantize + export), report (kv_scales.json, warnings, the report),
stage (the stage itself).
"""

from trtkv.calibrate.common import CHECKPOINT, KV_ALGO, KV_ENTRIES, STAGE, LayerScales, ModelLoader
from trtkv.calibrate.describe import (
    describe_calibration,
    export_targets,
    modelopt_config_spec,
    quantizes,
    supported_problems,
)
from trtkv.calibrate.modelopt_export import build_quant_cfg
from trtkv.calibrate.report import find_warnings, render_report
from trtkv.calibrate.stage import calibrate, calibration_batches, default_loader
from trtkv.recipe.layout import checkpoint_dir

__all__ = ["CHECKPOINT", "KV_ALGO", "KV_ENTRIES", "STAGE", "LayerScales", "ModelLoader", "build_quant_cfg", "calibrate",
           "calibration_batches", "checkpoint_dir", "default_loader", "describe_calibration", "export_targets",
           "find_warnings", "modelopt_config_spec", "quantizes", "render_report", "supported_problems"]
