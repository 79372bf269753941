"""Small random-weight models the tests build from a config (no download)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(layers: int, kv_heads: int, head_dim: int, max_positions: int, seed: int = 0) -> LlamaForCausalLM:
    """A random Llama (vocabulary 96, hidden 256, 4 query heads) in eval mode, the same for the same seed."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=96, hidden_size=256, intermediate_size=256, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=kv_heads, head_dim=head_dim,
                         max_position_embeddings=max_positions)
    return LlamaForCausalLM(config).eval()
