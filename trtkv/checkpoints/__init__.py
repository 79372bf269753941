"""Model checkpoints as the planner and `trtkv init` see them: per-layer attention, parameters, stored precision.

`attention` (layer types and the KV each keeps), `hf_config` (reading config.json, text_config included, refusing
what is not priced), `params` (parameters counted from the shapes, bytes as stored).
"""

from trtkv.checkpoints.hf_config import ModelConfigError, ModelFacts, config_file, read_model_facts
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
    "ACCOUNTING_TEXT", "Accounting", "AttentionKind", "KVShape", "LayerAttention", "ModelConfigError", "ModelFacts",
    "ParamCount", "compact_layers", "config_file", "count_parameters", "parse_layers", "read_model_facts",
    "stored_weight_bytes", "summary",
]
