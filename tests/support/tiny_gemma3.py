"""A small random Gemma 3 (hybrid sliding/full attention) the runtime and cache tests build from a config."""

from __future__ import annotations

import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

VOCAB = 128
LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]


def tiny_gemma3(window: int = 6, seed: int = 0) -> Gemma3ForCausalLM:
    """4 layers (full attention at 2), 2 query heads, 1 KV head, head_dim 32, window `window`, RoPE 10K local / 1M
    global, query_pre_attn_scalar 24 (not head_dim), and random (1 + w) norm weights so that w matters."""
    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=len(LAYER_TYPES),
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=window, layer_types=LAYER_TYPES,
        max_position_embeddings=256, query_pre_attn_scalar=24, rms_norm_eps=1e-6, pad_token_id=0, bos_token_id=2,
        eos_token_id=1, rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                                         "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}})
    model = Gemma3ForCausalLM(config).eval()
    model.config.architectures = ["Gemma3ForCausalLM"]
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(torch.randn_like(param) * 0.3)
    return model
