"""trtkv: from a YAML recipe to a served, measured LLM with a quantized KV cache."""

# The engine backends register their recipe rules (trtkv.recipe.BACKEND_RULES) when imported; importing them here
# makes every `import trtkv...` see complete validation.
from trtkv import backends as _backends  # noqa: E402,F401
from trtkv.version import __version__

__all__ = ["__version__"]
