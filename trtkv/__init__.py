"""trtkv: from a YAML recipe to a served, measured LLM with a quantized KV cache."""

__version__ = "0.1.0"
