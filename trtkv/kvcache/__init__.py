"""KV-cache numerics: formats, a quantized transformers Cache, K/V statistics.

Only `formats` is imported eagerly (it has no torch dependency) so the planner stays fast.
"""
