"""Model checkpoints as the planner and `trtkv init` see them: per-layer attention, parameters, stored precision.

`attention` (layer types and the KV each keeps), `hf_config` (reading config.json, text_config included, refusing
what is not priced), `params` (parameters counted from the shapes, bytes as stored).
"""

from trtkv.checkpoints.hf_config import ModelFacts, config_file, read_model_facts
from trtkv.checkpoints.params import ParamCount, count_parameters, stored_weight_bytes
from trtkv.recipe.attention import (
    ACCOUNTING_TEXT,
    Accounting,
    AttentionKind,
    KVShape,
    LayerAttention,
    compact_layers,
    parse_layers,
    summary,
)

__all__ = [
    "Accounting", "ACCOUNTING_TEXT", "AttentionKind", "compact_layers", "config_file", "count_parameters",
    "cpu_pin_bytes", "EngineKnobs", "gemma3_legacy_rope", "HF_ARCHITECTURES", "is_hub_id",
    "kv_bytes_per_token_per_gpu", "KV_CACHE_SCHEME", "KVShape", "LayerAttention", "local_model_dir",
    "model_config_path", "ModelFacts", "MODELOPT_QUANT_CONFIG", "models", "MoE", "no_knobs", "ParamCount",
    "parse_layers", "PER_TENSOR_NAMES", "read_model_facts", "reference_log_pool", "resolve_model_dir", "rope",
    "save_tokenizer", "SCALES_FILE", "ServedPool", "sglang_info_tokens", "sglang_knobs", "SGLANG_VERSION",
    "source_problem", "stored_weight_bytes", "summary", "TOKENIZER_FILES_VERSION", "trtllm_knobs", "trtllm_log_pool",
    "validate_attn_head_export", "validate_hf_checkpoint", "validate_trtllm_checkpoint", "vllm_block",
    "VLLM_DEFAULT_UTIL", "vllm_knobs", "vllm_log_tokens", "vllm_metrics_blocks", "VLLM_VERSION",
]
