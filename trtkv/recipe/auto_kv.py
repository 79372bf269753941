"""What each engine's automatic KV dtype does with a KV-cache format a checkpoint declares (the
setting trtkv serves quantization.kv_cache none with): the BackendRow column kv_from_checkpoint
(trtkv.recipe.backend_rules) that trtkv.recipe.stored.declared_kv_problems reads."""

from __future__ import annotations

from typing import NamedTuple

from trtkv.recipe.enums import KVCacheQuant


class KVFromCheckpoint(NamedTuple):
    """How an engine, under the KV setting trtkv serves quantization.kv_cache none with (the
    registry's none row: auto), runs the KV format a checkpoint declares rather than 16 bits."""

    why: str  # with where the engine's source says so
    # the declared storage it follows ("fp8", "nvfp4": trtkv.checkpoints.declared_kv_algo's first
    # word) -> the kv_cache that says what it then runs
    runs: dict[str, KVCacheQuant]
    ignored: tuple[str, ...] = ()  # declarations it leaves at 16 bits


TRTLLM_AUTO = KVFromCheckpoint(
    "TensorRT-LLM's LLM API keeps the checkpoint's kv_cache_quant_algo under "
    "kv_cache_config.dtype auto (llmapi/llm_utils.py ModelLoader._update_from_hf_quant_config "
    "overrides it only for dtype fp8 and nvfp4) and runs FP8 KV at scale 1.0 (NVFP4 with the "
    "checkpoint's scales)",
    {"fp8": KVCacheQuant.FP8_CAST, "nvfp4": KVCacheQuant.NVFP4},
)
VLLM_AUTO = KVFromCheckpoint(
    "vLLM 0.32 resolves --kv-cache-dtype auto to the checkpoint's declaration (a ModelOpt "
    "kv_cache_quant_algo / kv_cache_scheme: utils/torch_utils.py:457-530 "
    "resolve_kv_cache_dtype_string, called at engine/arg_utils.py:2257; a compressed-tensors "
    "kv_cache_scheme: model_executor/layers/attention/attention.py:287-291) and reads the "
    "checkpoint's k/v scales",
    {"fp8": KVCacheQuant.FP8, "nvfp4": KVCacheQuant.NVFP4},
)
SGLANG_AUTO = KVFromCheckpoint(
    "SGLang 0.5.23 turns --kv-cache-dtype auto into FP8 E4M3 where the checkpoint's quant "
    "config gives kv_cache_quant_algo FP8 (srt/mem_cache/kv_cache_dtype.py:49-57; ModelOpt's "
    "kv_cache_quant_algo / kv_cache_scheme, srt/layers/quantization/modelopt_quant.py; "
    "compressed-tensors' static per-tensor kv_cache_scheme, compressed_tensors.py:142-151) and "
    "reads the checkpoint's k/v scales",
    {"fp8": KVCacheQuant.FP8},
    ("fp8 per head",),
)
