"""Read a model's config.json into architecture facts: pure data-loading, every fact named with the
field it came from.

Families (field names as transformers' config classes and vLLM read them): Llama/Qwen/Mistral-style
dense and MoE (`num_key_value_heads`, `head_dim`,
`num_experts`/`num_local_experts`/`n_routed_experts`), sliding windows (`layer_types`,
`sliding_window_pattern`, `sliding_window` + `max_window_layers` with `use_sliding_window`, a
Mistral-style per-layer `sliding_window` list), chunked local attention (`attention_chunk_size`,
`no_rope_layers`), MLA (`kv_lora_rank`, `qk_rope_head_dim`), multimodal configs (`text_config`);
Gated DeltaNet and Mamba hybrids and Gemma 4's per-layer geometry through
trtkv.checkpoints.hybrid_config. Other state-space and linear-attention families are refused by name
with what trtkv would need to price them.

The file read and its fields checked: trtkv.checkpoints.hf_config_fields; each layer's attention:
trtkv.checkpoints.hf_attention_layers; the facts' record: trtkv.checkpoints.model_facts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtkv.checkpoints.checkpoint_quant import read_checkpoint_quant
from trtkv.checkpoints.hf_attention_layers import LAYER_TYPE_WORDS, read_attention_layers
from trtkv.checkpoints.hf_config_fields import (
    ModelConfigError,
    check_fields,
    config_file,
    load_config,
    positive_int,
)
from trtkv.checkpoints.hybrid_config import (
    GEMMA4_TYPES,
    NO_CACHE_WORDS,
    STATE_WORDS,
    HybridConfigError,
    HybridFacts,
    gemma4_layers,
    read_hybrid,
)
from trtkv.checkpoints.model_facts import ModelFacts, MoE
from trtkv.recipe.attention import AttentionKind, LayerAttention

# model_type -> what its non-attention layers are and why trtkv does not price them (refused rather
# than mispriced)
_READ = (
    "trtkv prices the fixed state of Gated DeltaNet (qwen3_next, qwen3_5) and of the Mamba layers "
    "of nemotron_h, granitemoehybrid and jamba"
)
REFUSED_MODEL_TYPES = {
    "mamba": "Mamba (state-space only, no attention layer for vLLM's hybrid pool to align with; "
    f"{_READ})",
    "mamba2": f"Mamba-2 (state-space only, no attention layer; {_READ})",
    "falcon_mamba": f"Falcon-Mamba (state-space only; {_READ})",
    "bamba": f"Bamba (Mamba-2 layers whose config fields trtkv does not read; {_READ})",
    "falcon_h1": f"Falcon-H1 (attention and Mamba-2 heads in parallel inside one layer; {_READ})",
    "zamba": f"Zamba (Mamba layers with a shared attention block; {_READ})",
    "zamba2": f"Zamba2 (Mamba-2 layers with shared attention blocks; {_READ})",
    "lfm2": f"LFM2 (short convolution layers: a conv state trtkv does not read; {_READ})",
    "minimax": f"MiniMax (lightning linear attention: a state shape trtkv does not read; {_READ})",
    "minimax_m1": f"MiniMax-M1 (lightning linear attention; {_READ})",
    "recurrent_gemma": f"RecurrentGemma (RG-LRU layers; {_READ})",
    "rwkv": f"RWKV (recurrent layers; {_READ})",
}
SINK_MODEL_TYPES = {
    "gpt_oss": "gpt-oss: learned per-head attention sinks (one logit per head, no KV cost)"
}


def read_model_facts(path: Path) -> ModelFacts:
    """Architecture facts from a config.json (a folder or the file), text_config of multimodal
    configs included."""
    file = config_file(path)
    top = load_config(file)
    text = top.get("text_config")
    cfg, prefix = (text, "text_config.") if isinstance(text, dict) else (top, "")
    problems = check_fields(top) + (check_fields(cfg, prefix) if cfg is not top else [])
    if problems:
        raise ModelConfigError(
            [
                f"{file}: {p}. Next: pass the model's own config.json, or write the recipe's model "
                f"section by hand."
                for p in problems
            ]
        )
    model_type = str(cfg.get("model_type") or top.get("model_type") or "")
    refused = REFUSED_MODEL_TYPES.get(model_type) or REFUSED_MODEL_TYPES.get(
        str(top.get("model_type") or "")
    )
    if refused is None and "hybrid_override_pattern" in cfg and model_type != "nemotron_h":
        refused = (
            f"{model_type or 'this model'} (hybrid_override_pattern: Mamba layers of a "
            f"family not read; {_READ})"
        )
    if refused:
        raise ModelConfigError(
            [
                f"{file}: model_type {model_type!r} is {refused}; trtkv refuses it rather than "
                "give a wrong figure. Next: plan a supported model, or give the recipe's model "
                "fields by hand knowing the state layers are left out."
            ]
        )
    if not isinstance(cfg.get("num_hidden_layers"), int) and model_type == "nemotron_h":
        # Nemotron-H: one entry a layer
        listed = cfg.get("hybrid_override_pattern") or cfg.get("layers_block_type")
        if isinstance(listed, (str, list)) and listed:
            cfg = {**cfg, "num_hidden_layers": len(listed)}
    problems = []
    needed = ("num_hidden_layers", "num_attention_heads", "hidden_size")
    for name in needed:
        if cfg.get(name) is None:
            problems.append(
                f"{file}: {prefix}{name}: missing; a positive integer is needed. Next: pass the "
                "model's own config.json, or write the recipe's model section by hand."
            )
    if problems:
        raise ModelConfigError(problems)
    layers_n, heads, hidden = (cfg[name] for name in needed)
    facts = ModelFacts(
        path=file,
        model_type=model_type,
        architectures=list(top.get("architectures") or []),
        num_layers=layers_n,
        num_attention_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        hidden_size=hidden,
        intermediate_size=positive_int(cfg.get("intermediate_size")),
        vocab_size=positive_int(cfg.get("vocab_size")),
        max_position_embeddings=positive_int(cfg.get("max_position_embeddings")),
        tie_word_embeddings=bool(
            cfg.get(
                "tie_word_embeddings",
                top.get("tie_word_embeddings", model_type.startswith("gemma")),
            )
        ),
        layers=(),
        attention_source="",
        prefix=prefix,
        dtype=str(
            cfg.get("torch_dtype")
            or cfg.get("dtype")
            or top.get("torch_dtype")
            or top.get("dtype")
            or ""
        )
        or None,
    )
    if facts.head_dim < 1:
        raise ModelConfigError(
            [
                f"{file}: {prefix}hidden_size {hidden} / num_attention_heads {heads} is below one "
                f"channel per head and {prefix}head_dim is absent. Next: fix the config."
            ]
        )
    _mla(cfg, facts)
    hybrid = _hybrid(cfg, facts, file)
    if hybrid is None:
        facts.layers, facts.attention_source = read_attention_layers(cfg, facts, file)
    if model_type in GEMMA4_TYPES:
        layers, extra = gemma4_layers(
            cfg, list(facts.layers), facts.num_kv_heads, facts.head_dim, prefix
        )
        facts.layers, facts.attention_source = tuple(layers), facts.attention_source + extra
    if not any(x.kind is not AttentionKind.NONE and not x.is_state for x in facts.layers):
        # an MLP-only or state-only layer list: no KV cache to size (the planner divides by it)
        listed = facts.attention_source.split(" (")[0] or f"{prefix}layers"
        raise ModelConfigError(
            [
                f"{file}: {listed} lists no attention layer (only MLP or state layers: no KV "
                "cache for trtkv to size). Next: pass the model's own config.json as published "
                "with its weights."
            ]
        )
    facts.sinks = SINK_MODEL_TYPES.get(model_type)
    facts.moe = _moe(cfg, facts)
    if hybrid is not None:
        _hybrid_mlp(cfg, facts, hybrid)
    facts.quant = read_checkpoint_quant(
        top.get("quantization_config") or cfg.get("quantization_config"), file.parent, facts.notes
    )
    return facts


def _hybrid(cfg: dict[str, Any], f: ModelFacts, file: Path) -> HybridFacts | None:
    """A Gated DeltaNet / Mamba hybrid's layers (state, attention, MLP-only) and state; None for
    other models."""
    try:
        hybrid = read_hybrid(cfg, f.model_type, f.num_layers, f.hidden_size, f.prefix)
    except HybridConfigError as exc:
        raise ModelConfigError(
            [
                f"{file}: model_type {f.model_type!r}: {exc}. Next: pass the model's own "
                "config.json as published with its weights."
            ]
        ) from None
    if hybrid is None:
        return None
    if len(hybrid.words) != f.num_layers:
        raise ModelConfigError(
            [
                f"{file}: {hybrid.source} lists {len(hybrid.words)} layers for "
                f"{f.prefix}num_hidden_layers {f.num_layers}. Next: fix the config."
            ]
        )
    known = set(LAYER_TYPE_WORDS) | STATE_WORDS | NO_CACHE_WORDS
    unknown = sorted(set(hybrid.words) - known)
    if unknown:
        raise ModelConfigError(
            [
                f"{file}: {hybrid.source} holds {', '.join(unknown)} (known: "
                f"{', '.join(sorted(known))}). Next: fix the config."
            ]
        )
    window = positive_int(cfg.get("sliding_window"))
    layers = [
        LayerAttention(hybrid.state_kind)
        if w in STATE_WORDS
        else LayerAttention(AttentionKind.NONE)
        if w in NO_CACHE_WORDS
        else LayerAttention(AttentionKind.SLIDING, window)
        if w == "sliding_attention" and window
        else LayerAttention(AttentionKind.FULL)
        for w in hybrid.words
    ]
    f.layers, f.attention_source = (
        tuple(layers),
        f"{hybrid.source} ({hybrid.state.source if hybrid.state else ''})",
    )
    f.state, f.state_params, f.mlp_matrices = hybrid.state, hybrid.state_params, hybrid.mlp_matrices
    f.config_ssm_dtype = hybrid.config_ssm_dtype
    f.attention_layers = tuple(
        i for i, x in enumerate(layers) if not x.is_state and x.kind is not AttentionKind.NONE
    )
    if not hybrid.attention_in_every_layer:
        f.dense_mlp_layers = tuple(i for i, w in enumerate(hybrid.words) if w == "mlp")
    return hybrid


def _hybrid_mlp(cfg: dict[str, Any], f: ModelFacts, hybrid: HybridFacts) -> None:
    """Where a hybrid's experts sit: Nemotron-H's E layers, Jamba's expert_layer_period / offset."""
    if f.moe is None:
        return
    if f.model_type == "nemotron_h":
        f.moe.moe_layers = tuple(i for i, w in enumerate(hybrid.words) if w == "moe")
        f.moe.shared_intermediate_size = (
            positive_int(cfg.get("moe_shared_expert_intermediate_size")) or 0
        )
        f.moe.source += f", experts in the E layers of {hybrid.source}"
    elif f.model_type == "jamba":
        period, offset = (
            positive_int(cfg.get("expert_layer_period")) or 1,
            int(cfg.get("expert_layer_offset") or 0),
        )
        f.moe.moe_layers = tuple(i for i in range(f.num_layers) if i % period == offset)
        f.moe.source += f", expert_layer_period {period}, expert_layer_offset {offset}"
    elif f.model_type == "granitemoehybrid":
        f.moe.shared_intermediate_size = positive_int(cfg.get("shared_intermediate_size")) or 0


def _mla(cfg: dict[str, Any], f: ModelFacts) -> None:
    rank, rope = positive_int(cfg.get("kv_lora_rank")), positive_int(cfg.get("qk_rope_head_dim"))
    if rank is None:
        return
    f.kv_lora_rank, f.qk_rope_head_dim = rank, rope or 0
    f.qk_nope_head_dim = positive_int(cfg.get("qk_nope_head_dim")) or 0
    f.v_head_dim = positive_int(cfg.get("v_head_dim"))
    f.q_lora_rank = positive_int(cfg.get("q_lora_rank"))
    # q/k head dim; hidden // heads is not it for MLA
    f.head_dim = f.qk_nope_head_dim + f.qk_rope_head_dim
    f.sparse_mla = positive_int(cfg.get("index_topk")) is not None


def _moe(cfg: dict[str, Any], f: ModelFacts) -> MoE | None:
    p = f.prefix
    for key in ("n_routed_experts", "num_local_experts", "num_experts"):
        experts = positive_int(cfg.get(key))
        if experts and experts > 1:
            break
    else:
        return None
    top_k = (
        positive_int(cfg.get("num_experts_per_tok"))
        or positive_int(cfg.get("experts_per_token"))
        or 1
    )
    width = positive_int(cfg.get("moe_intermediate_size")) or f.intermediate_size or 0
    shared = 0
    if positive_int(cfg.get("n_shared_experts")):
        # DeepSeek: shared experts of the expert width
        shared = int(cfg["n_shared_experts"]) * width
    elif positive_int(cfg.get("shared_expert_intermediate_size")):
        shared = int(cfg["shared_expert_intermediate_size"])  # Qwen2-MoE
    elif f.model_type == "llama4_text" or f.model_type == "llama4":
        shared = f.intermediate_size or 0  # Llama 4: one shared expert of intermediate_size
    n = f.num_layers
    if isinstance(cfg.get("moe_layers"), list):
        layers = tuple(int(i) for i in cfg["moe_layers"] if isinstance(i, int) and 0 <= i < n)
        src = f"{p}moe_layers"
    elif "first_k_dense_replace" in cfg:
        first, freq = (
            int(cfg.get("first_k_dense_replace") or 0),
            positive_int(cfg.get("moe_layer_freq")) or 1,
        )
        layers = tuple(i for i in range(first, n) if (i - first) % freq == 0)
        src = f"{p}first_k_dense_replace {first}, {p}moe_layer_freq {freq}"
    elif "decoder_sparse_step" in cfg or "mlp_only_layers" in cfg:
        step = positive_int(cfg.get("decoder_sparse_step")) or 1
        dense = set(cfg.get("mlp_only_layers") or [])
        layers = tuple(i for i in range(n) if i not in dense and (i + 1) % step == 0)
        src = f"{p}decoder_sparse_step {step}, {p}mlp_only_layers"
    elif positive_int(cfg.get("interleave_moe_layer_step")):
        step = int(cfg["interleave_moe_layer_step"])
        layers = tuple(i for i in range(n) if (i + 1) % step == 0)
        src = f"{p}interleave_moe_layer_step {step}"
    else:
        layers, src = tuple(range(n)), "every layer"
    if f.model_type.startswith("llama4"):
        # dense layers' width
        f.intermediate_size = positive_int(cfg.get("intermediate_size_mlp")) or f.intermediate_size
    return MoE(experts, top_k, width, shared, layers, f"{p}{key} {experts}, top {top_k}, {src}")
