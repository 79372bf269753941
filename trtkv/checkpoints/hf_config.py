"""Read a model's config.json into architecture facts: pure data-loading, every fact named with the field it came from.

Families (field names as transformers' config classes and vLLM read them): Llama/Qwen/Mistral-style dense and MoE
(`num_key_value_heads`, `head_dim`, `num_experts`/`num_local_experts`/`n_routed_experts`), sliding windows
(`layer_types`, `sliding_window_pattern`, `sliding_window` + `max_window_layers` with `use_sliding_window`, a
Mistral-style per-layer `sliding_window` list), chunked local attention (`attention_chunk_size`, `no_rope_layers`),
MLA (`kv_lora_rank`, `qk_rope_head_dim`), multimodal configs (`text_config`); Gated DeltaNet and Mamba hybrids and Gemma
4's per-layer geometry through trtkv.checkpoints.hybrid_config. Other state-space and linear-attention families are
refused by name with what trtkv would need to price them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtkv.checkpoints.hybrid_config import (
    GEMMA4_TYPES,
    NO_CACHE_WORDS,
    STATE_WORDS,
    HybridConfigError,
    HybridFacts,
    gemma4_layers,
    read_hybrid,
)
from trtkv.core.errors import RecipeError
from trtkv.core.files import NotReadable, read_json
from trtkv.recipe.attention import AttentionKind, LayerAttention
from trtkv.recipe.limits import CONFIG_FIELDS, MAX_LIST, WORD, check_config_field
from trtkv.recipe.state import StateSpec

MAX_CONFIG_BYTES = 4 * 1024 * 1024  # a config.json is a few KB; refuse anything that is not one
# Fields read as words, flags and lists (the numbers' ranges are trtkv.recipe.limits.CONFIG_FIELDS). Every word that
# reaches a recipe, a comment or a command is one of these, so it cannot carry a newline or a quote.
WORD_FIELDS = ("model_type", "torch_dtype", "dtype", "quant_method", "quant_algo", "mamba_ssm_cache_dtype")
FLAG_FIELDS = ("use_sliding_window", "tie_word_embeddings", "attention_k_eq_v")
LIST_FIELDS = ("layer_types", "no_rope_layers", "moe_layers", "mlp_only_layers", "layers_block_type")
# model_type -> what its non-attention layers are and why trtkv does not price them (refused rather than mispriced)
_READ = ("trtkv prices the fixed state of Gated DeltaNet (qwen3_next, qwen3_5) and of the Mamba layers of nemotron_h, "
         "granitemoehybrid and jamba")
REFUSED_MODEL_TYPES = {
    "mamba": f"Mamba (state-space only, no attention layer for vLLM's hybrid pool to align with; {_READ})",
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
LAYER_TYPE_WORDS = {"full_attention": AttentionKind.FULL, "sliding_attention": AttentionKind.SLIDING,
                    "chunked_attention": AttentionKind.CHUNKED, "attention": AttentionKind.FULL}
SINK_MODEL_TYPES = {"gpt_oss": "gpt-oss: learned per-head attention sinks (one logit per head, no KV cost)"}


class ModelConfigError(RecipeError):
    """A config.json trtkv cannot read: names the file, the field and the next step."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(problems, header="Model config not readable")


@dataclass
class MoE:
    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    shared_intermediate_size: int  # 0 when none (all shared experts together)
    moe_layers: tuple[int, ...]
    source: str


@dataclass
class StoredQuant:
    method: str
    weight_bytes: float  # bytes per quantized weight, scales included
    quantized: str  # which weights: "linear" (all linear layers but routers) or "experts"
    source: str


@dataclass
class ModelFacts:
    path: Path
    model_type: str
    architectures: list[str]
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int | None
    vocab_size: int | None
    max_position_embeddings: int | None
    tie_word_embeddings: bool
    layers: tuple[LayerAttention, ...]
    attention_source: str
    v_head_dim: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    q_lora_rank: int | None = None
    sparse_mla: bool = False
    sinks: str | None = None
    moe: MoE | None = None
    quant: StoredQuant | None = None
    dtype: str | None = None
    prefix: str = ""  # "text_config." for multimodal configs
    notes: list[str] = field(default_factory=list)
    state: StateSpec | None = None  # the fixed per-sequence state of the linear / mamba layers
    state_params: float = 0.0  # parameters of one state layer's mixer
    attention_layers: tuple[int, ...] | None = None  # layers with attention projections (None: every layer)
    dense_mlp_layers: tuple[int, ...] | None = None  # layers with a dense MLP (None: every layer without experts)
    mlp_matrices: int = 3  # gated MLP (gate, up, down); 2 for an ungated one (Nemotron-H's relu2)
    config_ssm_dtype: str | None = None  # the config's mamba_ssm_cache_dtype (vLLM's Nemotron-H default)


def config_file(path: Path) -> Path:
    """The config.json in `path` (a folder) or `path` itself."""
    return path / "config.json" if path.is_dir() else path


def load_config(path: Path) -> dict[str, Any]:
    """The parsed config.json, read as untrusted text (trtkv.core.files: a regular file, at most MAX_CONFIG_BYTES,
    strict JSON); ModelConfigError naming the file and the next step."""
    file = config_file(path)
    try:
        data = read_json(file, MAX_CONFIG_BYTES, "model config")
    except NotReadable as exc:
        raise ModelConfigError([f"{file}: {exc.problem}. Next: pass a model folder holding config.json, or the "
                                f"model's config.json itself as published with its weights."]) from None
    if not isinstance(data, dict):
        raise ModelConfigError([f"{file}: the top level is {type(data).__name__}, not an object. Next: pass the "
                                f"model's config.json."])
    return data


def check_fields(cfg: dict[str, Any], prefix: str = "") -> list[str]:
    """Every problem with the fields trtkv reads: numbers within trtkv.recipe.limits' ranges (CONFIG_FIELDS), words
    (model_type, dtype, architectures, quant_method) as identifiers, flags as booleans, layer lists as lists. A
    problem names the field (with `prefix`, e.g. "text_config.")."""
    problems: list[str] = []
    for name, value in cfg.items():
        if name in CONFIG_FIELDS:
            problems += check_config_field(name, value)
        elif name in WORD_FIELDS and value is not None and not _word(value):
            problems.append(f"{name}: {_shown(value)} is not a name (letters, digits, '_', '-', '.'; 1-128)")
        elif name in FLAG_FIELDS and value is not None and not isinstance(value, bool):
            problems.append(f"{name}: {_shown(value)} is not true or false")
        elif name in LIST_FIELDS and value is not None and (not isinstance(value, list) or len(value) > MAX_LIST):
            problems.append(f"{name}: {_shown(value)} is not a list of at most {MAX_LIST} entries")
    archs = cfg.get("architectures")
    if archs is not None and not (isinstance(archs, list) and len(archs) <= 16 and all(_word(a) for a in archs)):
        problems.append(f"architectures: {_shown(archs)} is not a list of class names")
    types = cfg.get("layer_types")
    if isinstance(types, list) and not all(isinstance(t, str) and _word(t) for t in types):
        problems.append(f"layer_types: {_shown(types)} holds entries that are not layer-type words")
    quant = cfg.get("quantization_config")
    if quant is not None and not isinstance(quant, dict):
        problems.append(f"quantization_config: {_shown(quant)} is not an object")
    elif isinstance(quant, dict):
        problems += [f"quantization_config.{p}" for p in check_fields(quant)]
    return [f"{prefix}{p}" for p in problems]


def _word(value: Any) -> bool:
    return isinstance(value, str) and WORD.fullmatch(value) is not None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_model_facts(path: Path) -> ModelFacts:
    """Architecture facts from a config.json (a folder or the file), text_config of multimodal configs included."""
    file = config_file(path)
    top = load_config(file)
    text = top.get("text_config")
    cfg, prefix = (text, "text_config.") if isinstance(text, dict) else (top, "")
    problems = check_fields(top) + (check_fields(cfg, prefix) if cfg is not top else [])
    if problems:
        raise ModelConfigError([f"{file}: {p}. Next: pass the model's own config.json, or write the recipe's model "
                                f"section by hand." for p in problems])
    model_type = str(cfg.get("model_type") or top.get("model_type") or "")
    refused = REFUSED_MODEL_TYPES.get(model_type) or REFUSED_MODEL_TYPES.get(str(top.get("model_type") or ""))
    if refused is None and "hybrid_override_pattern" in cfg and model_type != "nemotron_h":
        refused = f"{model_type or 'this model'} (hybrid_override_pattern: Mamba layers of a family not read; {_READ})"
    if refused:
        raise ModelConfigError([f"{file}: model_type {model_type!r} is {refused}; trtkv refuses it rather than give a "
                                f"wrong figure. Next: plan a supported model, or give the recipe's model fields by "
                                f"hand knowing the state layers are left out."])
    if not isinstance(cfg.get("num_hidden_layers"), int) and model_type == "nemotron_h":
        listed = cfg.get("hybrid_override_pattern") or cfg.get("layers_block_type")  # Nemotron-H: one entry a layer
        if isinstance(listed, (str, list)) and listed:
            cfg = {**cfg, "num_hidden_layers": len(listed)}
    problems = []
    for name in ("num_hidden_layers", "num_attention_heads", "hidden_size"):
        if cfg.get(name) is None:
            problems.append(f"{file}: {prefix}{name}: missing; a positive integer is needed. Next: pass the model's "
                            f"own config.json, or write the recipe's model section by hand.")
    if problems:
        raise ModelConfigError(problems)
    layers_n, heads, hidden = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["hidden_size"]
    facts = ModelFacts(
        path=file, model_type=model_type, architectures=list(top.get("architectures") or []), num_layers=layers_n,
        num_attention_heads=heads, num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads), hidden_size=hidden,
        intermediate_size=_int(cfg.get("intermediate_size")), vocab_size=_int(cfg.get("vocab_size")),
        max_position_embeddings=_int(cfg.get("max_position_embeddings")),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", top.get("tie_word_embeddings",
                                                                        model_type.startswith("gemma")))),
        layers=(), attention_source="", prefix=prefix,
        dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or top.get("torch_dtype") or top.get("dtype") or "") or None,
    )
    if facts.head_dim < 1:
        raise ModelConfigError([f"{file}: {prefix}hidden_size {hidden} / num_attention_heads {heads} is below one "
                                f"channel per head and {prefix}head_dim is absent. Next: fix the config."])
    _mla(cfg, facts)
    hybrid = _hybrid(cfg, facts, file)
    if hybrid is None:
        facts.layers, facts.attention_source = _layers(cfg, facts, file)
    if model_type in GEMMA4_TYPES:
        layers, extra = gemma4_layers(cfg, list(facts.layers), facts.num_kv_heads, facts.head_dim, prefix)
        facts.layers, facts.attention_source = tuple(layers), facts.attention_source + extra
    facts.sinks = SINK_MODEL_TYPES.get(model_type)
    facts.moe = _moe(cfg, facts)
    if hybrid is not None:
        _hybrid_mlp(cfg, facts, hybrid)
    facts.quant = _stored_quant(top.get("quantization_config") or cfg.get("quantization_config"), facts)
    return facts


def _hybrid(cfg: dict[str, Any], f: ModelFacts, file: Path) -> HybridFacts | None:
    """A Gated DeltaNet / Mamba hybrid's layers (state, attention, MLP-only) and state; None for other models."""
    try:
        hybrid = read_hybrid(cfg, f.model_type, f.num_layers, f.hidden_size, f.prefix)
    except HybridConfigError as exc:
        raise ModelConfigError([f"{file}: model_type {f.model_type!r}: {exc}. Next: pass the model's own config.json "
                                f"as published with its weights."]) from None
    if hybrid is None:
        return None
    if len(hybrid.words) != f.num_layers:
        raise ModelConfigError([f"{file}: {hybrid.source} lists {len(hybrid.words)} layers for "
                                f"{f.prefix}num_hidden_layers {f.num_layers}. Next: fix the config."])
    known = set(LAYER_TYPE_WORDS) | STATE_WORDS | NO_CACHE_WORDS
    unknown = sorted(set(hybrid.words) - known)
    if unknown:
        raise ModelConfigError([f"{file}: {hybrid.source} holds {', '.join(unknown)} (known: {', '.join(sorted(known))})"
                                f". Next: fix the config."])
    window = _int(cfg.get("sliding_window"))
    layers = [LayerAttention(hybrid.state_kind) if w in STATE_WORDS else LayerAttention(AttentionKind.NONE)
              if w in NO_CACHE_WORDS else LayerAttention(AttentionKind.SLIDING, window)
              if w == "sliding_attention" and window else LayerAttention(AttentionKind.FULL) for w in hybrid.words]
    f.layers, f.attention_source = tuple(layers), f"{hybrid.source} ({hybrid.state.source if hybrid.state else ''})"
    f.state, f.state_params, f.mlp_matrices = hybrid.state, hybrid.state_params, hybrid.mlp_matrices
    f.config_ssm_dtype = hybrid.config_ssm_dtype
    f.attention_layers = tuple(i for i, x in enumerate(layers) if not x.is_state and x.kind is not AttentionKind.NONE)
    if not hybrid.attention_in_every_layer:
        f.dense_mlp_layers = tuple(i for i, w in enumerate(hybrid.words) if w == "mlp")
    return hybrid


def _hybrid_mlp(cfg: dict[str, Any], f: ModelFacts, hybrid: HybridFacts) -> None:
    """Where a hybrid's experts sit: Nemotron-H's E layers, Jamba's expert_layer_period / offset."""
    if f.moe is None:
        return
    if f.model_type == "nemotron_h":
        f.moe.moe_layers = tuple(i for i, w in enumerate(hybrid.words) if w == "moe")
        f.moe.shared_intermediate_size = _int(cfg.get("moe_shared_expert_intermediate_size")) or 0
        f.moe.source += f", experts in the E layers of {hybrid.source}"
    elif f.model_type == "jamba":
        period, offset = _int(cfg.get("expert_layer_period")) or 1, int(cfg.get("expert_layer_offset") or 0)
        f.moe.moe_layers = tuple(i for i in range(f.num_layers) if i % period == offset)
        f.moe.source += f", expert_layer_period {period}, expert_layer_offset {offset}"
    elif f.model_type == "granitemoehybrid":
        f.moe.shared_intermediate_size = _int(cfg.get("shared_intermediate_size")) or 0


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _mla(cfg: dict[str, Any], f: ModelFacts) -> None:
    rank, rope = _int(cfg.get("kv_lora_rank")), _int(cfg.get("qk_rope_head_dim"))
    if rank is None:
        return
    f.kv_lora_rank, f.qk_rope_head_dim = rank, rope or 0
    f.qk_nope_head_dim = _int(cfg.get("qk_nope_head_dim")) or 0
    f.v_head_dim = _int(cfg.get("v_head_dim"))
    f.q_lora_rank = _int(cfg.get("q_lora_rank"))
    f.head_dim = f.qk_nope_head_dim + f.qk_rope_head_dim  # q/k head dim; hidden // heads is not it for MLA
    f.sparse_mla = _int(cfg.get("index_topk")) is not None


def _layers(cfg: dict[str, Any], f: ModelFacts, file: Path) -> tuple[tuple[LayerAttention, ...], str]:
    """Per-layer attention and the fields it came from."""
    n, p = f.num_layers, f.prefix
    if f.kv_lora_rank:
        return (LayerAttention(AttentionKind.MLA),) * n, f"{p}kv_lora_rank + {p}qk_rope_head_dim (MLA)"
    window = cfg.get("sliding_window")
    chunk = _int(cfg.get("attention_chunk_size"))
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        if len(types) != n:
            raise ModelConfigError([f"{file}: {p}layer_types has {len(types)} entries for {p}num_hidden_layers {n}. "
                                    f"Next: fix the config (one entry per layer)."])
        unknown = sorted({str(t) for t in types if t not in LAYER_TYPE_WORDS})
        if unknown:
            raise ModelConfigError([f"{file}: {p}layer_types holds {', '.join(unknown)}: not attention trtkv prices "
                                    f"(known: {', '.join(LAYER_TYPE_WORDS)}); state-space and linear-attention layers "
                                    f"are refused until priced. Next: plan an attention-only model."])
        out = []
        for t in types:
            kind = LAYER_TYPE_WORDS[t]
            size = _window(window, file, p) if kind is AttentionKind.SLIDING else chunk if kind is AttentionKind.CHUNKED \
                else None
            if kind is not AttentionKind.FULL and not size:
                raise ModelConfigError([f"{file}: {p}layer_types says {t} but {p}"
                                        f"{'sliding_window' if kind is AttentionKind.SLIDING else 'attention_chunk_size'}"
                                        f" is missing. Next: fix the config."])
            out.append(LayerAttention(kind, size) if size else LayerAttention(AttentionKind.FULL))
        src = f"{p}layer_types" + (f" + {p}sliding_window" if window else "") + (f" + {p}attention_chunk_size"
                                                                                  if chunk else "")
        return tuple(out), src
    if chunk:
        nope = cfg.get("no_rope_layers")
        if isinstance(nope, list) and len(nope) == n:
            rope = [bool(x) for x in nope]
            src = f"{p}attention_chunk_size + {p}no_rope_layers"
        else:
            interval = _int(cfg.get("no_rope_layer_interval")) or 4
            rope = [(i + 1) % interval != 0 for i in range(n)]
            src = f"{p}attention_chunk_size + {p}no_rope_layer_interval {interval} (transformers' default when " \
                  f"no_rope_layers is empty)"
        return tuple(LayerAttention(AttentionKind.CHUNKED, chunk) if r else LayerAttention(AttentionKind.FULL)
                     for r in rope), src
    if cfg.get("use_sliding_window") is False:  # Qwen2/Qwen3: the window is set but off
        return (LayerAttention(AttentionKind.FULL),) * n, f"{p}use_sliding_window false"
    if isinstance(window, list):  # Mistral-style per-layer list, repeated over the layers
        if not window:
            raise ModelConfigError([f"{file}: {p}sliding_window: an empty list (a per-layer list needs one entry per "
                                    f"layer, null for a full layer). Next: fix the config."])
        sizes = [_window(w, file, p) if w else None for w in window]
        mpe = f.max_position_embeddings
        out = [LayerAttention(AttentionKind.SLIDING, s) if s and (mpe is None or s < mpe) else
               LayerAttention(AttentionKind.FULL) for s in (sizes[i % len(sizes)] for i in range(n))]
        return tuple(out), f"{p}sliding_window (a per-layer list, repeated)"
    if window is None:
        return (LayerAttention(AttentionKind.FULL),) * n, \
            f"no {p}layer_types, sliding_window or attention_chunk_size: every layer full"
    size = _window(window, file, p)
    pattern = _int(cfg.get("sliding_window_pattern"))
    if pattern is None and f.model_type == "gemma2":
        pattern = 2  # Gemma 2 alternates in code (even layers sliding); its config.json has no pattern
    if pattern:
        src = f"{p}sliding_window + {p}sliding_window_pattern {pattern}" if cfg.get("sliding_window_pattern") else \
            f"{p}sliding_window + Gemma 2's alternation (layer i sliding when i is even)"
        return tuple(LayerAttention(AttentionKind.SLIDING, size) if (i + 1) % pattern else
                     LayerAttention(AttentionKind.FULL) for i in range(n)), src
    first_full = _int(cfg.get("max_window_layers")) if "use_sliding_window" in cfg else None
    if first_full is not None:  # Qwen2 with use_sliding_window true: layers from max_window_layers on slide
        return tuple(LayerAttention(AttentionKind.SLIDING, size) if i >= first_full else
                     LayerAttention(AttentionKind.FULL) for i in range(n)), \
            f"{p}use_sliding_window + {p}sliding_window + {p}max_window_layers {first_full}"
    return (LayerAttention(AttentionKind.SLIDING, size),) * n, f"{p}sliding_window (every layer, Mistral-7B-v0.1 style)"


def _window(value: Any, file: Path, prefix: str) -> int:
    size = _int(value)
    if size is None:
        raise ModelConfigError([f"{file}: {prefix}sliding_window: {value!r} is not a positive integer. Next: fix the "
                                f"config."])
    return size


def _moe(cfg: dict[str, Any], f: ModelFacts) -> MoE | None:
    p = f.prefix
    for key in ("n_routed_experts", "num_local_experts", "num_experts"):
        experts = _int(cfg.get(key))
        if experts and experts > 1:
            break
    else:
        return None
    top_k = _int(cfg.get("num_experts_per_tok")) or _int(cfg.get("experts_per_token")) or 1
    width = _int(cfg.get("moe_intermediate_size")) or f.intermediate_size or 0
    shared = 0
    if _int(cfg.get("n_shared_experts")):
        shared = int(cfg["n_shared_experts"]) * width  # DeepSeek: shared experts of the expert width
    elif _int(cfg.get("shared_expert_intermediate_size")):
        shared = int(cfg["shared_expert_intermediate_size"])  # Qwen2-MoE
    elif f.model_type == "llama4_text" or f.model_type == "llama4":
        shared = f.intermediate_size or 0  # Llama 4: one shared expert of intermediate_size
    n = f.num_layers
    if isinstance(cfg.get("moe_layers"), list):
        layers = tuple(int(i) for i in cfg["moe_layers"] if isinstance(i, int) and 0 <= i < n)
        src = f"{p}moe_layers"
    elif "first_k_dense_replace" in cfg:
        first, freq = int(cfg.get("first_k_dense_replace") or 0), _int(cfg.get("moe_layer_freq")) or 1
        layers = tuple(i for i in range(first, n) if (i - first) % freq == 0)
        src = f"{p}first_k_dense_replace {first}, {p}moe_layer_freq {freq}"
    elif "decoder_sparse_step" in cfg or "mlp_only_layers" in cfg:
        step = _int(cfg.get("decoder_sparse_step")) or 1
        dense = set(cfg.get("mlp_only_layers") or [])
        layers = tuple(i for i in range(n) if i not in dense and (i + 1) % step == 0)
        src = f"{p}decoder_sparse_step {step}, {p}mlp_only_layers"
    elif _int(cfg.get("interleave_moe_layer_step")):
        step = int(cfg["interleave_moe_layer_step"])
        layers = tuple(i for i in range(n) if (i + 1) % step == 0)
        src = f"{p}interleave_moe_layer_step {step}"
    else:
        layers, src = tuple(range(n)), "every layer"
    if f.model_type.startswith("llama4"):
        f.intermediate_size = _int(cfg.get("intermediate_size_mlp")) or f.intermediate_size  # dense layers' width
    return MoE(experts, top_k, width, shared, layers, f"{p}{key} {experts}, top {top_k}, {src}")


def _stored_quant(q: Any, f: ModelFacts) -> StoredQuant | None:
    """Pre-quantized checkpoints, priced as stored."""
    if not isinstance(q, dict):
        return None
    method = str(q.get("quant_method") or q.get("quant_algo") or "").lower()
    if method == "fp8":
        block = q.get("weight_block_size")
        if isinstance(block, list) and len(block) == 2 and all(_int(b) for b in block):
            per = 1 + 4 / (block[0] * block[1])  # one float32 scale per block
            return StoredQuant("fp8", per, "linear", f"quantization_config fp8, {block[0]}x{block[1]} blocks")
        return StoredQuant("fp8", 1.0, "linear", "quantization_config fp8, per-tensor scales")
    if method == "mxfp4":
        return StoredQuant("mxfp4", 0.5 + 1 / 32, "experts",
                           "quantization_config mxfp4 (E2M1 + one E8M0 scale per 32; attention, router, embeddings "
                           "unquantized)")
    if method in ("awq", "gptq") and _int(q.get("bits")):
        bits, group = int(q["bits"]), _int(q.get("group_size")) or 128
        return StoredQuant(method, bits / 8 + 4 / group, "linear",
                           f"quantization_config {method} {bits}-bit, group {group} (fp16 scale + zero)")
    f.notes.append(f"quantization_config quant_method {method or '?'}: not priced as stored (trtkv knows fp8, mxfp4, "
                   f"awq, gptq); weights priced at the recipe's precision.")
    return None
