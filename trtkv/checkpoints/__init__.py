"""Model checkpoints as the planner and `trtkv init` see them: the model's facts, parameters, stored
precision.

`hf_config` (reading config.json, text_config included, refusing what is not priced; each layer's
attention as trtkv.recipe.attention names it, the one home of those facts), with `hf_config_fields`
(the file read as untrusted text, its fields checked), `hf_attention_layers` (each layer's attention
from the config's fields) and `model_facts` (the facts' record), `params` (parameters counted from
the shapes, bytes as stored).
"""

from typing import TYPE_CHECKING

from trtkv.checkpoints.hf_config import read_model_facts
from trtkv.checkpoints.hf_config_fields import config_file
from trtkv.checkpoints.model_facts import ModelFacts, MoE
from trtkv.checkpoints.params import count_parameters, stored_weight_bytes
from trtkv.core.lazy import attach

if TYPE_CHECKING:
    from trtkv.checkpoints.hf_export import (
        HF_ARCHITECTURES,
        gemma3_legacy_rope,
        validate_hf_checkpoint,
    )
    from trtkv.checkpoints.models import (
        is_hub_id,
        local_model_dir,
        resolve_model_dir,
        source_problem,
    )
    from trtkv.checkpoints.render import DECODERS, DEFAULT_SEQ_LEN
    from trtkv.checkpoints.serving_memory import (
        REFERENCE_LOG,
        SGLANG_INFO,
        SGLANG_VERSION,
        TRTLLM_LOG,
        VLLM_DEFAULT_UTIL,
        VLLM_LOG,
        VLLM_VERSION,
        EngineKnobs,
        ServedPool,
        cpu_pin_bytes,
        kv_bytes_per_token_per_gpu,
        model_config_path,
        no_knobs,
        reference_log_pool,
        sglang_info_tokens,
        sglang_knobs,
        trtllm_knobs,
        trtllm_log_pool,
        vllm_block,
        vllm_knobs,
        vllm_log_tokens,
        vllm_metrics_blocks,
    )
    from trtkv.checkpoints.tokenizer_files import TOKENIZER_FILES_VERSION, save_tokenizer
    from trtkv.checkpoints.trtllm_checkpoint import validate_trtllm_checkpoint

# the rest is imported on first use (the exports, the checkpoint checks, the engines' memory rules)
__getattr__, __dir__ = attach(
    __name__,
    submodules=["models", "render", "rope"],
    submod_attrs={
        "hf_export": ["gemma3_legacy_rope", "HF_ARCHITECTURES", "validate_hf_checkpoint"],
        "models": ["is_hub_id", "local_model_dir", "resolve_model_dir", "source_problem"],
        "render": ["DECODERS", "DEFAULT_SEQ_LEN"],
        "serving_memory": [
            "cpu_pin_bytes",
            "EngineKnobs",
            "kv_bytes_per_token_per_gpu",
            "model_config_path",
            "no_knobs",
            "REFERENCE_LOG",
            "reference_log_pool",
            "ServedPool",
            "SGLANG_INFO",
            "sglang_info_tokens",
            "sglang_knobs",
            "SGLANG_VERSION",
            "trtllm_knobs",
            "TRTLLM_LOG",
            "trtllm_log_pool",
            "vllm_block",
            "VLLM_DEFAULT_UTIL",
            "vllm_knobs",
            "VLLM_LOG",
            "vllm_log_tokens",
            "vllm_metrics_blocks",
            "VLLM_VERSION",
        ],
        "tokenizer_files": ["save_tokenizer", "TOKENIZER_FILES_VERSION"],
        "trtllm_checkpoint": ["validate_trtllm_checkpoint"],
    },
)

__all__ = [
    "config_file",
    "count_parameters",
    "cpu_pin_bytes",
    "DECODERS",
    "DEFAULT_SEQ_LEN",
    "EngineKnobs",
    "gemma3_legacy_rope",
    "HF_ARCHITECTURES",
    "is_hub_id",
    "kv_bytes_per_token_per_gpu",
    "local_model_dir",
    "model_config_path",
    "ModelFacts",
    "models",
    "MoE",
    "no_knobs",
    "read_model_facts",
    "REFERENCE_LOG",
    "reference_log_pool",
    "render",
    "resolve_model_dir",
    "rope",
    "save_tokenizer",
    "ServedPool",
    "SGLANG_INFO",
    "sglang_info_tokens",
    "sglang_knobs",
    "SGLANG_VERSION",
    "source_problem",
    "stored_weight_bytes",
    "TOKENIZER_FILES_VERSION",
    "trtllm_knobs",
    "TRTLLM_LOG",
    "trtllm_log_pool",
    "validate_hf_checkpoint",
    "validate_trtllm_checkpoint",
    "vllm_block",
    "VLLM_DEFAULT_UTIL",
    "vllm_knobs",
    "VLLM_LOG",
    "vllm_log_tokens",
    "vllm_metrics_blocks",
    "VLLM_VERSION",
]
