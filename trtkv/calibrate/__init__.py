"""The calibrate stage: ModelOpt calibration of KV scales (and FP8 weights), exported for
TensorRT-LLM and HF.

recipe -> engines/<recipe>/checkpoint/:
  config.json + rank{r}.safetensors   TensorRT-LLM checkpoint (export_tensorrt_llm_checkpoint, tp/pp
  from the recipe) hf/                                 HF checkpoint (export_hf_checkpoint; FP8 or
  no KV: ModelOpt 0.47 asserts on INT8) tokenizer/                          the model's tokenizer,
  for downstream stages hf_config.json                      the model's HF config.json (build reads
  it: an INT8-KV checkpoint has no hf/) kv_scales.json                      per layer k/v amax,
  TensorRT-LLM factor, vLLM k_scale/v_scale (byte-stable);
                                      kv_cache none: kv_cache_quant_algo null and no layers
  calibration_report.md               per-layer table, warnings, K/V statistics
  manifest.json                       stage contract (trtkv.contracts.stage.run_stage)
Heavy imports (torch, transformers, modelopt) happen inside the functions that need them. Modules:
common (shared names), describe (the dry run), modelopt_export (quantize + export), report
(kv_scales.json, warnings, the report), stage (the stage itself).
"""

from trtkv.calibrate.describe import describe_calibration
from trtkv.calibrate.scale_clip import audit_target
from trtkv.calibrate.stage import calibrate

__all__ = ["audit_target", "calibrate", "describe_calibration"]
