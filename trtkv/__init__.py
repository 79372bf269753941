"""trtkv: from a YAML recipe to a served, measured LLM with a quantized KV cache."""

__version__ = "0.1.0"

# The engine backends register their recipe rules (trtkv.recipe.BACKEND_RULES) when imported; importing them here
# makes every `import trtkv...` see complete validation.
from trtkv import backends as _backends  # noqa: E402,F401
