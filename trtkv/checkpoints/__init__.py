"""Model checkpoints as the planner and `trtkv init` see them: the model's facts, parameters, stored
precision.

`hf_config` (reading config.json, text_config included, refusing what is not priced; each layer's
attention as trtkv.recipe.attention names it, the one home of those facts), with `hf_config_fields`
(the file read as untrusted text, its fields checked), `hf_attention_layers` (each layer's attention
from the config's fields) and `model_facts` (the facts' record), `params` (parameters counted from
the shapes, bytes as stored), `checkpoint_quant` (a checkpoint's own quantization: formats per
tensor group, the KV scheme it declares, declared_kv_algo as TensorRT-LLM reads it),
`safetensors_headers` (the tensors a folder stores, from the headers alone) and `stored_weights`
(bytes per tensor group as stored, or estimated).
"""

from typing import TYPE_CHECKING

from trtkv.checkpoints.checkpoint_quant import (
    HF_QUANT_CONFIG,
    declared_kv_algo,
    read_checkpoint_quant,
)
from trtkv.checkpoints.hf_config import read_model_facts
from trtkv.checkpoints.hf_config_fields import config_file
from trtkv.checkpoints.model_facts import ModelFacts, MoE
from trtkv.checkpoints.params import count_parameters, stored_weight_bytes
from trtkv.checkpoints.stored_weights import stored_note
from trtkv.core.lazy import attach

if TYPE_CHECKING:
    from trtkv.checkpoints.hf_export import (
        HF_ARCHITECTURES,
        gemma3_legacy_rope,
        validate_hf_checkpoint,
    )
    from trtkv.checkpoints.kv_scale_tensors import (
        CheckpointScales,
        ScaleTensor,
        checkpoint_folders,
        read_checkpoint_scales,
    )
    from trtkv.checkpoints.models import (
        is_hub_id,
        local_model_dir,
        resolve_model_dir,
        source_problem,
    )
    from trtkv.checkpoints.render import DECODERS, DEFAULT_SEQ_LEN
    from trtkv.checkpoints.tokenizer_files import TOKENIZER_FILES_VERSION, save_tokenizer
    from trtkv.checkpoints.trtllm_checkpoint import validate_trtllm_checkpoint

# the rest is imported on first use (the exports, the checkpoint checks)
__getattr__, __dir__ = attach(__name__, submodules=["models", "render", "rope"], stub=__file__)

__all__ = [
    "checkpoint_folders",
    "CheckpointScales",
    "config_file",
    "count_parameters",
    "declared_kv_algo",
    "DECODERS",
    "DEFAULT_SEQ_LEN",
    "gemma3_legacy_rope",
    "HF_ARCHITECTURES",
    "HF_QUANT_CONFIG",
    "is_hub_id",
    "local_model_dir",
    "ModelFacts",
    "models",
    "MoE",
    "read_checkpoint_quant",
    "read_checkpoint_scales",
    "read_model_facts",
    "render",
    "resolve_model_dir",
    "rope",
    "save_tokenizer",
    "ScaleTensor",
    "source_problem",
    "stored_note",
    "stored_weight_bytes",
    "TOKENIZER_FILES_VERSION",
    "validate_hf_checkpoint",
    "validate_trtllm_checkpoint",
]
