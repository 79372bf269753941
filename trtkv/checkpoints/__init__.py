"""Model checkpoints as the planner and `trtkv init` see them: the model's facts, parameters, stored precision.

`hf_config` (reading config.json, text_config included, refusing what is not priced; each layer's attention as
trtkv.recipe.attention names it, the one home of those facts), `params` (parameters counted from the shapes, bytes
as stored).
"""

from trtkv.checkpoints.hf_config import ModelConfigError, ModelFacts, config_file, read_model_facts
from trtkv.checkpoints.params import ParamCount, count_parameters, stored_weight_bytes

__all__ = [
    "ModelConfigError", "ModelFacts", "ParamCount", "config_file", "count_parameters", "read_model_facts",
    "stored_weight_bytes",
]
