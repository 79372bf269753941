"""Recipe texts the tests start from."""

# A valid CPU recipe: SmolLM2's shape, FP8 weights and KV, the reference runtime.
GOOD = """\
model:
  source: packaged:smollm2
  num_layers: 30
  num_attention_heads: 9
  num_kv_heads: 3
  head_dim: 64
  hidden_size: 576
quantization: {weights: fp8, kv_cache: fp8}
build: {backend: reference, max_input_len: 1024, max_seq_len: 2048}
hardware: {gpu: cpu}
"""
