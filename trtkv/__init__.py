"""trtkv: from a YAML recipe to a served, measured LLM with a quantized KV cache."""

from trtkv.version import __version__

__all__ = ["__version__"]
