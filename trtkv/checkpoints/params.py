"""Parameters counted from a config's shapes (MoE experts and shared experts, MLA projections, tied
embeddings), and the bytes a pre-quantized checkpoint stores them in."""

from __future__ import annotations

from dataclasses import dataclass

from trtkv.checkpoints.model_facts import ModelFacts
from trtkv.checkpoints.safetensors_headers import holds_weights, read_tensors
from trtkv.recipe.attention import AttentionKind, LayerAttention


@dataclass(frozen=True)
class ParamCount:
    total: float
    embedding: float  # input embeddings + lm_head (one matrix when tied)
    experts: float  # routed experts (MoE); 0 for dense models
    routers: float
    # what one token's forward pass multiplies by (top-k experts, shared ones, the rest)
    active_per_token: float
    attention: float = 0.0  # attention projections (MLA's included) of every attention layer


def attention_parameters(f: ModelFacts, layer: LayerAttention | None = None) -> float:
    h, q = f.hidden_size, f.num_attention_heads
    # MLA: q (optionally low-rank), kv_a to the latent + rope key, kv_b back to heads, o
    if f.kv_lora_rank:
        qk = (f.qk_nope_head_dim or 0) + (f.qk_rope_head_dim or 0)
        v = f.v_head_dim or f.qk_nope_head_dim or 0
        q_proj = h * f.q_lora_rank + f.q_lora_rank * q * qk if f.q_lora_rank else h * q * qk
        kv_a = h * (f.kv_lora_rank + (f.qk_rope_head_dim or 0))
        kv_b = f.kv_lora_rank * q * ((f.qk_nope_head_dim or 0) + v)
        return float(q_proj + kv_a + kv_b + q * v * h)
    d = layer.head_dim if layer is not None and layer.head_dim else f.head_dim
    kv = layer.kv_heads if layer is not None and layer.kv_heads else f.num_kv_heads
    return float(h * q * d * 2 + h * kv * d * 2)


def count_parameters(f: ModelFacts) -> ParamCount:
    """Linear layers of every decoder layer (attention where a layer has it, a hybrid's state
    mixers, the dense MLP or the experts) plus embeddings; norms and biases are left out (<
    0.1%)."""
    h, n = f.hidden_size, f.num_layers
    layers = f.layers or (LayerAttention(AttentionKind.FULL),) * n
    with_attention = f.attention_layers if f.attention_layers is not None else tuple(range(n))
    attn = sum(
        attention_parameters(f, layers[i] if i < len(layers) else None) for i in with_attention
    )
    state = f.state_params * sum(1 for x in layers if x.is_state)
    dense_mlp = f.mlp_matrices * h * (f.intermediate_size or 0)
    experts = routers = shared = 0.0
    moe_layers: set[int] = set()
    top_k = 0
    if f.moe is not None:
        moe_layers = set(f.moe.moe_layers)
        experts = (
            len(moe_layers)
            * f.moe.num_experts
            * f.mlp_matrices
            * h
            * f.moe.expert_intermediate_size
        )
        shared = len(moe_layers) * f.mlp_matrices * h * f.moe.shared_intermediate_size
        routers = len(moe_layers) * h * f.moe.num_experts
        top_k = f.moe.experts_per_token
    dense = (
        f.dense_mlp_layers
        if f.dense_mlp_layers is not None
        else [i for i in range(n) if i not in moe_layers]
    )
    mlp = len(dense) * dense_mlp + shared
    embed = float((f.vocab_size or 0) * h * (1 if f.tie_word_embeddings else 2))
    total = attn + state + mlp + experts + routers + embed
    active_experts = experts * top_k / f.moe.num_experts if f.moe else 0.0
    return ParamCount(
        total, embed, experts, routers, attn + state + mlp + active_experts + routers + embed, attn
    )


def stored_weight_bytes(f: ModelFacts, count: ParamCount, dtype_bytes: float) -> float | None:
    """Bytes of a pre-quantized checkpoint's weights as stored, else None: the safetensors headers'
    sum where config.json's folder holds the weights, else estimated from the declared format (per
    group: trtkv.checkpoints.stored_weights)."""
    if f.quant is None or f.quant.quantized == "none":
        return None
    if holds_weights(f.path.parent):
        return float(sum(e.nbytes for e in read_tensors(f.path.parent)))
    if f.quant.quantized == "experts":
        quantized = count.experts
    else:  # every linear weight but the routers and embeddings
        quantized = count.total - count.embedding - count.routers
    return quantized * f.quant.weight_bytes + (count.total - quantized) * dtype_bytes
