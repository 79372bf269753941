"""The KV memory planner: bytes per token and per sequence, what fits on the recipe's GPUs, and advice.

Formulas (per format, scale overhead included, see `trtkv.kvcache.formats`), summed layer by layer
(`trtkv.recipe.attention`: a sliding layer keeps at most its window, a chunked one its chunk, an MLA layer one
latent of kv_lora_rank + qk_rope_head_dim elements per token):
  KV bytes/token         = sum over layers of 2 x kv_heads x head_dim x bytes/element (MLA: latent x bytes/element)
  KV of one sequence(n)  = sum over layers of tokens the layer holds at n x its bytes/token; `exact` (TensorRT-LLM's
                           per-layer windows) or `vllm` (its allocation, blocks and padded hybrid groups)
  per GPU                = the fullest pipeline stage's layers, ceil(kv_heads/tp) heads each (KV heads replicate when
                           tp > kv_heads; an MLA latent is whole on every rank)
  weights/GPU            = (quantized linear params x bytes/weight + embeddings x dtype bytes) / (tp x pp)
  KV budget/GPU          = (GPU memory - weights/GPU - activation reserve) x kv_cache_free_gpu_mem_fraction
  tokens that fit        = KV budget/GPU / KV bytes per token per GPU; sequences(n) = budget / KV of one sequence(n)
  decode step lower bound = (weights/GPU + batch x KV one sequence reads at n per GPU) / HBM bandwidth
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trtkv.checkpoints import (
    ACCOUNTING_TEXT,
    Accounting,
    AttentionKind,
    KVShape,
    LayerAttention,
    ModelFacts,
    compact_layers,
    count_parameters,
    parse_layers,
    read_model_facts,
    stored_weight_bytes,
)
from trtkv.checkpoints import summary as layer_summary
from trtkv.core.errors import RecipeError
from trtkv.kvcache.formats import KVFormat
from trtkv.platform.hardware import GPU, GPU_SPECS
from trtkv.recipe import ModelDtype, Recipe, WeightQuant
from trtkv.recipe.attention import (
    VLLM_BLOCK_CPU,
    VLLM_BLOCK_GPU,
    bytes_by_attention,
    layer_formats,
    sequence_kv_bytes,
    vllm_hybrid_on,
)
from trtkv.recipe.backend_rules import KV_ACCOUNTING

GIB = 1024**3
PLAN_LENGTHS = (4096, 8192, 16384, 32768, 131072)
PLAN_FORMATS = (KVFormat.FP16, KVFormat.FP8, KVFormat.INT8, KVFormat.INT4_G32, KVFormat.INT4_G64, KVFormat.INT4_G128)
DTYPE_BYTES = {ModelDtype.FLOAT16: 2, ModelDtype.BFLOAT16: 2, ModelDtype.FLOAT32: 4}
# Bytes per weight of quantized linear layers; embeddings and lm_head stay in the model dtype (ModelOpt default).
WEIGHT_BYTES = {WeightQuant.FP8: 1.0, WeightQuant.INT8_SQ: 1.0, WeightQuant.INT4_AWQ: 0.5 + 2 / 128}
ARCH_FIELDS = ("num_layers", "num_attention_heads", "num_kv_heads", "head_dim", "hidden_size",
               "intermediate_size", "vocab_size", "max_position_embeddings")


@dataclass
class Architecture:
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int | None = None
    vocab_size: int | None = None
    num_parameters: float | None = None
    max_position_embeddings: int | None = None
    tie_word_embeddings: bool = False
    source: str = "recipe"
    layers: tuple[LayerAttention, ...] = ()  # empty: every layer full attention
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    sparse_mla: bool = False
    attention_source: str = "recipe: no model.attention_layers, every layer full"
    sinks: str | None = None
    counted_parameters: float | None = None  # from the config's shapes (MoE, MLA, tied embeddings)
    counted_embedding: float | None = None
    expert_parameters: float = 0.0
    stored_weights_bytes: float | None = None  # a pre-quantized checkpoint, as stored
    config_notes: list[str] = field(default_factory=list)

    def layer_list(self) -> tuple[LayerAttention, ...]:
        return self.layers or (LayerAttention(AttentionKind.FULL),) * self.num_layers

    def kv_shape(self) -> KVShape:
        latent = (self.kv_lora_rank + (self.qk_rope_head_dim or 0)) if self.kv_lora_rank else None
        return KVShape(self.num_kv_heads, self.head_dim, mla_latent=latent, sparse_mla=self.sparse_mla)

    def uniform_full(self) -> bool:
        return all(x.kind is AttentionKind.FULL for x in self.layer_list())

    def parameters(self) -> float:
        """The recipe's count, else one counted from the config's shapes, else an estimate (Llama-style blocks)."""
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
    facts = {
        "num_layers": f.num_layers, "num_attention_heads": f.num_attention_heads, "num_kv_heads": f.num_kv_heads,
        "head_dim": f.head_dim, "hidden_size": f.hidden_size, "intermediate_size": f.intermediate_size,
        "vocab_size": f.vocab_size, "max_position_embeddings": f.max_position_embeddings,
        "kv_lora_rank": f.kv_lora_rank, "qk_rope_head_dim": f.qk_rope_head_dim if f.kv_lora_rank else None,
    }
    return {k: v for k, v in facts.items() if v is not None}


def model_config_path(recipe: Recipe) -> Path | None:
    """config.json of the recipe's model when it is on this machine (local folder or converted package)."""
    source = recipe.model.source
    if source.startswith("packaged:"):
        from trtkv.checkpoints.models import packaged_model_dir  # light import: paths only

        folder = packaged_model_dir(source.split(":", 1)[1])
    else:
        folder = Path(source).expanduser()
        if not folder.is_absolute() and recipe.path is not None:
            folder = recipe.path.parent / folder
    cfg = folder / "config.json"
    return cfg if cfg.is_file() else None


def resolve_architecture(recipe: Recipe) -> Architecture:
    """Architecture facts from the model config when present, else the recipe; they must agree."""
    m = recipe.model
    given = {k: getattr(m, k) for k in (*ARCH_FIELDS, "kv_lora_rank", "qk_rope_head_dim") if getattr(m, k) is not None}
    facts: dict[str, Any] = dict(given)
    extra: dict[str, Any] = {}
    source = "recipe"
    given_layers = parse_layers(m.attention_layers) if m.attention_layers else ()
    if given_layers:
        extra.update(layers=given_layers, attention_source=m.attention_source or "recipe model.attention_layers")
    cfg_path = model_config_path(recipe)
    if cfg_path is not None:
        f = read_model_facts(cfg_path)
        from_config = _config_facts(f)
        clashes = [f"model.{k}: recipe says {given[k]}, {cfg_path} says {v}" for k, v in from_config.items()
                   if k in given and given[k] != v]
        if given_layers and given_layers != f.layers:
            clashes.append(f"model.attention_layers: recipe says {compact_layers(given_layers)}, {cfg_path} says "
                           f"{compact_layers(f.layers)} ({f.attention_source})")
        if clashes:
            raise RecipeError([f"{recipe.path}: {c}. Next: remove the field from the recipe or fix it." for c in clashes],
                              header="Recipe disagrees with the model config")
        facts.update(from_config)
        count = count_parameters(f)
        dtype_bytes = DTYPE_BYTES[m.dtype]
        extra.update(tie_word_embeddings=f.tie_word_embeddings, layers=f.layers, sparse_mla=f.sparse_mla,
                     attention_source=f"{cfg_path.name} {f.attention_source}", sinks=f.sinks,
                     counted_embedding=count.embedding, expert_parameters=count.experts,
                     stored_weights_bytes=stored_weight_bytes(f, count, dtype_bytes), config_notes=list(f.notes))
        if f.moe is not None or f.kv_lora_rank or f.quant is not None:
            extra["counted_parameters"] = count.total  # the Llama-style estimate does not fit these
        source = f"model config {cfg_path}"
    elif m.checkpoint_weights_gib:
        extra["stored_weights_bytes"] = m.checkpoint_weights_gib * GIB
    missing = [k for k in ("num_layers", "num_attention_heads", "num_kv_heads", "head_dim", "hidden_size") if k not in facts]
    if missing:
        raise RecipeError(
            [f"{recipe.path}: model.{k}: not given and no model config on this machine to read it from. "
             f"Next: add it to the recipe's model section." for k in missing],
            header="Architecture unknown",
        )
    return Architecture(**facts, **extra, num_parameters=m.num_parameters, source=source)


@dataclass
class FormatCapacity:
    format: str
    bytes_per_token: float  # every layer holding the token (short contexts)
    bytes_per_token_per_gpu: float
    tokens_per_gpu_budget: int
    max_sequences: dict[int, int]
    kv_gib_at_max_batch: dict[int, float]
    decode_step_ms: dict[int, float]  # at each length, batch = min(max_batch_size, what fits)
    accounting: str = ACCOUNTING_TEXT[Accounting.EXACT]  # which engine's sizing the capacity follows
    per_sequence_kv_bytes: dict[int, float] = field(default_factory=dict)  # one sequence, all GPUs, this accounting
    per_sequence_kv_bytes_per_gpu: dict[int, float] = field(default_factory=dict)
    per_sequence_kv_bytes_by_accounting: dict[str, dict[int, float]] = field(default_factory=dict)
    tokens_fit: dict[int, int] = field(default_factory=dict)  # max_sequences x length, per GPU
    bytes_by_attention: dict[int, dict[str, float]] = field(default_factory=dict)  # exact, per layer type


@dataclass
class Plan:
    recipe: str
    model: dict[str, Any]
    hardware: dict[str, Any]
    weights: dict[str, Any]
    kv_budget_gib_per_gpu: float
    recipe_kv_format: str
    lengths: list[int]
    formats: list[FormatCapacity]
    examples: list[dict[str, Any]]
    advice: list[str]
    advice_basis: str
    notes: list[str] = field(default_factory=list)
    attention: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def host_memory_gib() -> float | None:
    """Total RAM of this machine (the CPU recipe's 'device' memory)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    except (ValueError, OSError, AttributeError):
        return None


def kv_format_for_recipe(recipe: Recipe) -> KVFormat:
    """The recipe's KV format (Recipe.kv_format)."""
    return recipe.kv_format


def per_gpu_bytes_per_token(arch: Architecture, fmt: KVFormat, tp: int, pp: int,
                            skip: tuple[int | str, ...] = (), skip_fmt: KVFormat = KVFormat.BF16) -> float:
    """The fullest GPU's bytes per token with every layer holding it: its pipeline stage's layers (those in `skip`
    stored in `skip_fmt`) x its share of the KV heads (an MLA latent whole)."""
    return _seq(arch, layer_formats(arch.layer_list(), fmt, skip, skip_fmt), 1, tp, pp)


def _seq(arch: Architecture, fmts: list[KVFormat], context: int, tp: int = 1, pp: int = 1,
         accounting: Accounting = Accounting.EXACT, batched_tokens: int = 8192, block: int = VLLM_BLOCK_GPU) -> float:
    return sequence_kv_bytes(arch.layer_list(), arch.kv_shape(), fmts, context, tp, pp, accounting, batched_tokens,
                             block)


def weights_bytes(arch: Architecture, recipe: Recipe) -> tuple[float, float]:
    """(total bytes, per-GPU bytes) of the weights at the recipe's precision (as stored when pre-quantized)."""
    dtype_bytes = DTYPE_BYTES[recipe.model.dtype]
    if recipe.quantization.weights is WeightQuant.NONE and arch.stored_weights_bytes:
        return arch.stored_weights_bytes, arch.stored_weights_bytes / recipe.world_size
    params = arch.parameters()
    embed = min(arch.embedding_parameters(), params)
    per_weight = WEIGHT_BYTES.get(recipe.quantization.weights, float(dtype_bytes))
    total = (params - embed) * per_weight + embed * dtype_bytes
    return total, total / recipe.world_size


def recipe_accounting(recipe: Recipe) -> tuple[Accounting, int]:
    """The engine sizing the recipe's backend follows, and vLLM's block size on its hardware."""
    block = VLLM_BLOCK_CPU if recipe.hardware.gpu is GPU.CPU else VLLM_BLOCK_GPU
    return KV_ACCOUNTING[recipe.build.backend], block


def plan(recipe: Recipe, probe_dir: Path | None = None) -> Plan:
    arch = resolve_architecture(recipe)
    hw = recipe.hardware
    tp, pp = recipe.build.tp_size, recipe.build.pp_size
    on_cpu = hw.gpu is GPU.CPU
    spec = None if on_cpu else GPU_SPECS[hw.gpu]
    memory_gib = hw.memory_gib or (spec.memory_gib if spec else None)
    bandwidth = hw.hbm_bandwidth_gbps or (spec.hbm_bandwidth_gbps if spec else None)
    w_total, w_gpu = weights_bytes(arch, recipe)
    notes: list[str] = []
    if memory_gib is None:
        memory_gib = host_memory_gib()
        notes.append(f"hardware.gpu is cpu: capacity uses this host's RAM ({memory_gib:.1f} GiB); "
                     f"set hardware.memory_gib to plan for another machine.")
    if memory_gib is None:
        budget = 0.0
    else:
        free = memory_gib * GIB - w_gpu - hw.activation_reserve_gib * GIB
        if free <= 0:
            notes.append(f"weights ({w_gpu / GIB:.1f} GiB/GPU) and the activation reserve do not fit in "
                         f"{memory_gib:g} GiB: raise tp_size/pp_size or quantize the weights.")
        budget = max(0.0, free) * recipe.triton.kv_cache_free_gpu_mem_fraction
    lengths = sorted({*PLAN_LENGTHS, recipe.build.max_seq_len})
    rec_fmt = kv_format_for_recipe(recipe)
    formats = list(PLAN_FORMATS)
    if rec_fmt not in formats:
        formats.insert(0, rec_fmt)
    caps = []
    skip = tuple(recipe.quantization.kv_skip_layers)
    rows: list[tuple[str, KVFormat, tuple[int | str, ...]]] = [(f.value, f, ()) for f in formats]
    if skip:  # the recipe's mixed configuration, first
        rows.insert(0, (recipe.kv_format_label, rec_fmt, skip))
    accounting, block = recipe_accounting(recipe)
    mnbt = recipe.build.max_num_tokens
    for label, fmt, skipped in rows:
        fmts = layer_formats(arch.layer_list(), fmt, skipped, recipe.kv_skip_format)
        bpt = _seq(arch, fmts, 1)
        bpt_gpu = _seq(arch, fmts, 1, tp, pp)
        by_acc = {a.value: {n: _seq(arch, fmts, n, 1, 1, a, mnbt, block) for n in lengths}
                  for a in Accounting}
        seq = by_acc[accounting.value]
        seq_gpu = {n: _seq(arch, fmts, n, tp, pp, accounting, mnbt, block) for n in lengths}
        read_gpu = {n: _seq(arch, fmts, n, tp, pp) for n in lengths}  # what a decode step reads
        tokens = int(budget // bpt_gpu) if budget else 0
        max_seqs = {n: int(budget // seq_gpu[n]) if budget else 0 for n in lengths}
        gib = {n: recipe.build.max_batch_size * seq[n] / GIB for n in lengths}
        step = {}
        if bandwidth:
            for n in lengths:
                batch = max(1, min(recipe.build.max_batch_size, max_seqs[n] or 1))
                step[n] = (w_gpu + batch * read_gpu[n]) / (bandwidth * 1e9) * 1e3
        caps.append(FormatCapacity(label, bpt, bpt_gpu, tokens, max_seqs, gib, step, ACCOUNTING_TEXT[accounting], seq,
                                   seq_gpu, by_acc, {n: max_seqs[n] * n for n in lengths},
                                   {n: bytes_by_attention(arch.layer_list(), arch.kv_shape(), fmts, n) for n in lengths}))
    examples = []
    for n, batch in ((32768, 8), (recipe.build.max_seq_len, recipe.build.max_batch_size)):
        row: dict[str, Any] = {"context_len": n, "batch": batch}
        for c in caps:
            row[f"{c.format}_gib"] = round(batch * c.per_sequence_kv_bytes.get(n, n * c.bytes_per_token) / GIB, 3)
        examples.append(row)
    advice, basis = _advice(recipe, arch, caps, rec_fmt, spec is not None and spec.has_fp8, probe_dir)
    from trtkv.probe.results import per_layer_advice

    mixed = per_layer_advice(recipe, probe_dir)
    if mixed:
        advice = [*advice, mixed]
    model = {k: v for k, v in asdict(arch).items() if k not in ("layers", "config_notes")}
    return Plan(
        recipe=recipe.name,
        model={**model, "parameters": arch.parameters()},
        hardware={"gpu": hw.gpu.value, "count": hw.count, "memory_gib": memory_gib, "hbm_bandwidth_gbps": bandwidth,
                  "tp_size": tp, "pp_size": pp, "activation_reserve_gib": hw.activation_reserve_gib,
                  "kv_cache_free_gpu_mem_fraction": recipe.triton.kv_cache_free_gpu_mem_fraction},
        weights={"precision": _weights_label(arch, recipe), "total_gib": w_total / GIB, "per_gpu_gib": w_gpu / GIB},
        kv_budget_gib_per_gpu=budget / GIB,
        recipe_kv_format=recipe.kv_format_label,
        lengths=lengths,
        formats=caps,
        examples=examples,
        advice=advice,
        advice_basis=basis,
        notes=notes + _attention_notes(arch, recipe),
        attention=_attention_facts(arch, accounting, mnbt, block),
    )


def _weights_label(arch: Architecture, recipe: Recipe) -> str:
    if recipe.quantization.weights is WeightQuant.NONE and arch.stored_weights_bytes:
        return "as stored"
    return recipe.quantization.weights.value


def _attention_facts(arch: Architecture, accounting: Accounting, mnbt: int, block: int) -> dict[str, Any]:
    layers = arch.layer_list()
    return {"layers": [x.label for x in layers], "summary": layer_summary(layers), "source": arch.attention_source,
            "mla_latent_elements": arch.kv_shape().mla_latent, "sinks": arch.sinks,
            "accounting": ACCOUNTING_TEXT[accounting], "max_num_batched_tokens": mnbt, "vllm_block_size": block,
            "vllm_hybrid_manager": vllm_hybrid_on(layers)}


def _attention_notes(arch: Architecture, recipe: Recipe) -> list[str]:
    out = list(arch.config_notes)
    layers = arch.layer_list()
    if arch.kv_lora_rank:
        out.append(f"MLA: one latent of {arch.kv_shape().mla_latent} elements per token and layer (kv_lora_rank "
                   f"{arch.kv_lora_rank} + qk_rope_head_dim {arch.qk_rope_head_dim}), no separate V; under TP "
                   f"{recipe.build.tp_size} the latent is whole on every rank (per-GPU KV is not divided by TP)."
                   + (" vLLM stores fp8 as fp8_ds_mla, 656 bytes/token/layer (sparse MLA)." if arch.sparse_mla else ""))
    if arch.sinks:
        out.append(f"Attention sinks ({arch.sinks}): no KV cost, left out of the figures.")
    if any(x.kind is AttentionKind.CHUNKED for x in layers):
        n, fmts = recipe.build.max_seq_len, [KVFormat.FP16] * len(layers)
        on = sequence_kv_bytes(layers, arch.kv_shape(), fmts, n, 1, 1, Accounting.VLLM, recipe.build.max_num_tokens,
                               recipe_accounting(recipe)[1], hybrid=True)
        out.append(f"vLLM turns its hybrid KV manager off by default for chunked-local attention and sizes those "
                   f"layers as full attention (the vllm rows); with it on, one 16-bit sequence of {n:,} takes "
                   f"{on / GIB:.3g} GiB. TensorRT-LLM's exact figures keep one chunk.")
    if arch.expert_parameters:
        out.append(f"MoE: {arch.expert_parameters / 1e9:.1f}B of {arch.parameters() / 1e9:.1f}B parameters are routed "
                   f"experts, counted in full and split evenly over tp x pp (expert parallelism places the same "
                   f"bytes); the decode bound reads every weight, an upper bound for a step that routes to few experts.")
    return out


def _advice(recipe: Recipe, arch: Architecture, caps: list[FormatCapacity], rec_fmt: KVFormat, has_fp8: bool,
            probe_dir: Path | None) -> tuple[list[str], str]:
    from trtkv.probe.results import probe_advice  # small module, no torch

    measured = probe_advice(recipe, probe_dir)
    if measured is not None:
        return measured
    out: list[str] = []
    by = {c.format: c for c in caps}
    base = by.get(KVFormat.FP16.value)
    ctx = recipe.build.max_seq_len
    batch = recipe.build.max_batch_size
    if base is not None and base.tokens_per_gpu_budget:
        fits = base.max_sequences.get(ctx, 0)
        bound = fits < batch
        if ctx < 4096:
            out.append(f"Context {ctx} < 4K: KV cache quantization is rarely worth it for short-context chat; "
                       f"weights dominate memory.")
        elif bound:
            out.append(f"At max_seq_len {ctx}, fp16 KV fits {fits} sequences per replica but max_batch_size is {batch}: "
                       f"the batch is bound by KV memory, so an 8-bit KV cache (x2 capacity) pays off.")
        else:
            out.append(f"At max_seq_len {ctx}, fp16 KV already fits {fits} sequences (max_batch_size {batch}): "
                       f"KV quantization buys bandwidth (decode speed) more than capacity.")
    if not arch.uniform_full():
        out += _attention_advice(recipe, arch, caps, rec_fmt)
    elif ctx >= 8192:
        out.append("Context >= 8K: decode reads the whole KV cache every step, so halving its bytes cuts attention time.")
    if recipe.hardware.gpu is GPU.CPU:
        out.append("CPU reference runtime: FP8 and INT8 KV are emulated in software (same numerics as the engine); "
                   "on the GPU, prefer FP8 on Hopper/Ada/Blackwell.")
    elif has_fp8:
        out.append("This GPU has FP8: prefer an FP8 (E4M3) KV cache; its exponent bits tolerate range errors of static scales.")
    else:
        out.append("No FP8 on this target: use INT8 KV with calibrated scales.")
    out.append("INT8 KV only with calibrated (static) or per-token scales; uncalibrated INT8 clips.")
    if ctx > 16384:
        out.append("INT4 KV is risky at long context (error grows with every quantized past token): probe before use.")
    if rec_fmt is KVFormat.INT8:
        out.append("TensorRT-LLM shares one scale for K and V per layer (kv_cache_scaling_factor); check V's resolution "
                   "with `trtkv probe`.")
    return out, "heuristic: published guidance, no probe results for this model yet (run `trtkv probe`)"


def _attention_advice(recipe: Recipe, arch: Architecture, caps: list[FormatCapacity], rec_fmt: KVFormat) -> list[str]:
    """Advice from each layer type's share of one sequence's bytes at the recipe's length (exact accounting)."""
    by = {c.format: c for c in caps}
    base, rec = by.get(KVFormat.FP16.value), by.get(recipe.kv_format_label) or by.get(rec_fmt.value)
    n = recipe.build.max_seq_len
    if base is None or rec is None:
        return []
    shares = base.bytes_by_attention[n]
    total = sum(shares.values()) or 1.0
    counts: dict[str, int] = {}
    for layer in arch.layer_list():
        counts[layer.label] = counts.get(layer.label, 0) + 1
    parts = ", ".join(f"{counts[k]} {k} layers {v / total:.0%}" for k, v in sorted(shares.items(), key=lambda kv: -kv[1]))
    out = [f"At max_seq_len {n:,}, one sequence's 16-bit KV is {total / GIB:.3g} GiB: {parts} of it."]
    local = sum(v for k, v in shares.items() if k.startswith(("sliding", "chunked")))
    if local and rec is not base:
        kept = rec.per_sequence_kv_bytes_by_accounting[Accounting.EXACT.value][n]
        out.append(f"{rec.format} KV shrinks every layer alike: {total / GIB:.3g} -> {kept / GIB:.3g} GiB per sequence, "
                   f"{base.max_sequences[n]:,} -> {rec.max_sequences[n]:,} sequences of {n:,} per GPU; "
                   f"{1 - local / total:.0%} of the saving is in the full-attention layers, "
                   f"{local / total:.0%} in the windowed ones.")
        if any(x.kind is AttentionKind.SLIDING for x in arch.layer_list()) and \
                "sliding_window" not in recipe.quantization.kv_skip_layers:
            fmts = layer_formats(arch.layer_list(), rec_fmt, ("sliding_window",), recipe.kv_skip_format)
            mixed = _seq(arch, fmts, n)
            out.append(f"quantization.kv_skip_layers: [sliding_window] (vLLM) keeps the sliding layers 16-bit for "
                       f"{mixed / kept - 1:+.1%} bytes per sequence at {n:,} ({mixed / GIB:.3g} GiB).")
    if arch.kv_lora_rank:
        out.append(f"MLA: {arch.kv_shape().mla_latent} elements per token and layer in all; TP does not shrink it, "
                   f"so more GPUs add KV room only through PP or the weights they take off each GPU.")
    read = rec.per_sequence_kv_bytes_per_gpu[n] if accounting_is_exact(rec) else _seq(
        arch, layer_formats(arch.layer_list(), rec_fmt, tuple(recipe.quantization.kv_skip_layers), recipe.kv_skip_format), n,
        recipe.build.tp_size, recipe.build.pp_size)
    batch = max(1, min(recipe.build.max_batch_size, rec.max_sequences[n] or 1))
    weights = weights_bytes(arch, recipe)[1]
    out.append(f"A decode step at {n:,} tokens x batch {batch} reads {batch * read / GIB:.3g} GiB of KV per GPU beside "
               f"{weights / GIB:.3g} GiB of weights: KV is {batch * read / (batch * read + weights):.0%} of the bytes "
               f"read.")
    return out


def accounting_is_exact(c: FormatCapacity) -> bool:
    return c.accounting == ACCOUNTING_TEXT[Accounting.EXACT]
