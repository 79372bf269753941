"""The KV memory planner: bytes per token, what fits on the recipe's GPUs, and advice.

Formulas (per format, scale overhead included, see `trtkv.kvcache.formats`):
  KV bytes/token         = 2 x layers x kv_heads x head_dim x bytes/element
  per GPU                = layers/pp x ceil(kv_heads/tp) x head_dim x 2 x bytes/element (KV heads replicate when tp > kv_heads)
  weights/GPU            = (quantized linear params x bytes/weight + embeddings x dtype bytes) / (tp x pp)
  KV budget/GPU          = (GPU memory - weights/GPU - activation reserve) x kv_cache_free_gpu_mem_fraction
  tokens that fit        = KV budget/GPU / KV bytes per token per GPU
  decode step lower bound = (weights/GPU + batch x context x KV bytes/token/GPU) / HBM bandwidth
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trtkv.errors import RecipeError
from trtkv.hardware import GPU, GPU_SPECS
from trtkv.kvcache.formats import KVFormat, bytes_per_element, kv_bytes_per_token
from trtkv.recipe import ModelDtype, Recipe, WeightQuant

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

    def parameters(self) -> float:
        """The recipe's count, else an estimate from the shapes (Llama-style blocks)."""
        if self.num_parameters:
            return float(self.num_parameters)
        if self.intermediate_size is None or self.vocab_size is None:
            return 0.0
        h, q, kv, d = self.hidden_size, self.num_attention_heads, self.num_kv_heads, self.head_dim
        attn = h * q * d * 2 + h * kv * d * 2
        mlp = 3 * h * self.intermediate_size
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return float(self.num_layers * (attn + mlp) + embed)

    def embedding_parameters(self) -> float:
        if self.vocab_size is None:
            return 0.0
        return float(self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2))


def _config_facts(config: dict[str, Any]) -> dict[str, Any]:
    heads = config.get("num_attention_heads")
    hidden = config.get("hidden_size")
    facts = {
        "num_layers": config.get("num_hidden_layers"),
        "num_attention_heads": heads,
        "num_kv_heads": config.get("num_key_value_heads", heads),
        "head_dim": config.get("head_dim") or (hidden // heads if hidden and heads else None),
        "hidden_size": hidden,
        "intermediate_size": config.get("intermediate_size"),
        "vocab_size": config.get("vocab_size"),
        "max_position_embeddings": config.get("max_position_embeddings"),
    }
    return {k: v for k, v in facts.items() if v is not None}


def model_config_path(recipe: Recipe) -> Path | None:
    """config.json of the recipe's model when it is on this machine (local folder or converted package)."""
    source = recipe.model.source
    if source.startswith("packaged:"):
        from trtkv.model import packaged_model_dir  # light import: paths only

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
    given = {k: getattr(m, k) for k in ARCH_FIELDS if getattr(m, k) is not None}
    facts = dict(given)
    source = "recipe"
    tie = False
    cfg_path = model_config_path(recipe)
    if cfg_path is not None:
        config = json.loads(cfg_path.read_text())
        tie = bool(config.get("tie_word_embeddings", False))
        from_config = _config_facts(config)
        clashes = [f"model.{k}: recipe says {given[k]}, {cfg_path} says {v}" for k, v in from_config.items()
                   if k in given and given[k] != v]
        if clashes:
            raise RecipeError([f"{recipe.path}: {c}. Next: remove the field from the recipe or fix it." for c in clashes],
                              header="Recipe disagrees with the model config")
        facts.update(from_config)
        source = f"model config {cfg_path}"
    missing = [k for k in ("num_layers", "num_attention_heads", "num_kv_heads", "head_dim", "hidden_size") if k not in facts]
    if missing:
        raise RecipeError(
            [f"{recipe.path}: model.{k}: not given and no model config on this machine to read it from. "
             f"Next: add it to the recipe's model section." for k in missing],
            header="Architecture unknown",
        )
    return Architecture(**facts, num_parameters=m.num_parameters, tie_word_embeddings=tie, source=source)


@dataclass
class FormatCapacity:
    format: str
    bytes_per_token: float
    bytes_per_token_per_gpu: float
    tokens_per_gpu_budget: int
    max_sequences: dict[int, int]
    kv_gib_at_max_batch: dict[int, float]
    decode_step_ms: dict[int, float]  # at each length, batch = min(max_batch_size, what fits)


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
                            skip: tuple[int, ...] = (), skip_fmt: KVFormat = KVFormat.BF16) -> float:
    """The fullest GPU's bytes per token: its pipeline stage's layers (those in `skip` stored in `skip_fmt`) x its
    share of the KV heads."""
    per_stage = math.ceil(arch.num_layers / pp)
    heads = math.ceil(arch.num_kv_heads / tp)
    worst = 0.0
    for stage in range(pp):
        layers = range(stage * per_stage, min(arch.num_layers, (stage + 1) * per_stage))
        skipped = sum(1 for i in layers if i in skip)
        worst = max(worst, 2 * heads * arch.head_dim * ((len(layers) - skipped) * bytes_per_element(fmt, arch.head_dim)
                                                        + skipped * bytes_per_element(skip_fmt, arch.head_dim)))
    return worst


def weights_bytes(arch: Architecture, recipe: Recipe) -> tuple[float, float]:
    """(total bytes, per-GPU bytes) of the weights at the recipe's precision."""
    dtype_bytes = DTYPE_BYTES[recipe.model.dtype]
    params = arch.parameters()
    embed = min(arch.embedding_parameters(), params)
    per_weight = WEIGHT_BYTES.get(recipe.quantization.weights, float(dtype_bytes))
    total = (params - embed) * per_weight + embed * dtype_bytes
    return total, total / recipe.world_size


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
    rows: list[tuple[str, KVFormat, tuple[int, ...]]] = [(f.value, f, ()) for f in formats]
    if skip:  # the recipe's mixed configuration, first
        rows.insert(0, (recipe.kv_format_label, rec_fmt, skip))
    for label, fmt, skipped in rows:
        bpt = kv_bytes_per_token(arch.num_layers, arch.num_kv_heads, arch.head_dim, fmt, len(skipped),
                                 recipe.kv_skip_format)
        bpt_gpu = per_gpu_bytes_per_token(arch, fmt, tp, pp, skipped, recipe.kv_skip_format)
        tokens = int(budget // bpt_gpu) if budget else 0
        max_seqs = {n: tokens // n for n in lengths}
        gib = {n: recipe.build.max_batch_size * n * bpt / GIB for n in lengths}
        step = {}
        if bandwidth:
            for n in lengths:
                batch = max(1, min(recipe.build.max_batch_size, max_seqs[n] or 1))
                step[n] = (w_gpu + batch * n * bpt_gpu) / (bandwidth * 1e9) * 1e3
        caps.append(FormatCapacity(label, bpt, bpt_gpu, tokens, max_seqs, gib, step))
    examples = []
    for n, batch in ((32768, 8), (recipe.build.max_seq_len, recipe.build.max_batch_size)):
        row: dict[str, Any] = {"context_len": n, "batch": batch}
        for c in caps:
            row[f"{c.format}_gib"] = round(n * batch * c.bytes_per_token / GIB, 3)
        examples.append(row)
    advice, basis = _advice(recipe, arch, caps, rec_fmt, spec is not None and spec.has_fp8, probe_dir)
    from trtkv.probe.results import per_layer_advice

    mixed = per_layer_advice(recipe, probe_dir)
    if mixed:
        advice = [*advice, mixed]
    return Plan(
        recipe=recipe.name,
        model={**asdict(arch), "parameters": arch.parameters()},
        hardware={"gpu": hw.gpu.value, "count": hw.count, "memory_gib": memory_gib, "hbm_bandwidth_gbps": bandwidth,
                  "tp_size": tp, "pp_size": pp, "activation_reserve_gib": hw.activation_reserve_gib,
                  "kv_cache_free_gpu_mem_fraction": recipe.triton.kv_cache_free_gpu_mem_fraction},
        weights={"precision": recipe.quantization.weights.value, "total_gib": w_total / GIB, "per_gpu_gib": w_gpu / GIB},
        kv_budget_gib_per_gpu=budget / GIB,
        recipe_kv_format=recipe.kv_format_label,
        lengths=lengths,
        formats=caps,
        examples=examples,
        advice=advice,
        advice_basis=basis,
        notes=notes,
    )


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
    if ctx >= 8192:
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


def format_plan(p: Plan) -> str:
    lines = [f"Plan for {p.recipe}: {p.model['num_layers']} layers, {p.model['num_kv_heads']} KV heads x "
             f"head_dim {p.model['head_dim']}, {p.model['parameters'] / 1e9:.2f}B parameters ({p.model['source']})"]
    hw = p.hardware
    mem = f"{hw['memory_gib']:.1f} GiB" if hw["memory_gib"] else "memory unknown"
    bw = f"{hw['hbm_bandwidth_gbps']:g} GB/s" if hw["hbm_bandwidth_gbps"] else "bandwidth unknown"
    lines.append(f"Hardware: {hw['count']} x {hw['gpu']} ({mem}, {bw}), TP{hw['tp_size']} PP{hw['pp_size']}")
    lines.append(f"Weights ({p.weights['precision']}): {p.weights['total_gib']:.2f} GiB total, "
                 f"{p.weights['per_gpu_gib']:.2f} GiB per GPU; KV budget per GPU: {p.kv_budget_gib_per_gpu:.2f} GiB "
                 f"(after a {hw['activation_reserve_gib']:g} GiB reserve, x {hw['kv_cache_free_gpu_mem_fraction']:g})")
    lines.append(f"Recipe KV format: {p.recipe_kv_format}")
    lines.append("")
    head = ["format", "B/token", "B/token/GPU", "tokens/GPU"] + [f"seqs@{_k(n)}" for n in p.lengths]
    rows = [[c.format, f"{c.bytes_per_token:,.0f}", f"{c.bytes_per_token_per_gpu:,.0f}", f"{c.tokens_per_gpu_budget:,}"]
            + [f"{c.max_sequences[n]:,}" for n in p.lengths] for c in p.formats]
    lines += _table(head, rows)
    if any(c.decode_step_ms for c in p.formats):
        lines.append("")
        lines.append("Decode step lower bound (ms; weights + KV read once per step at HBM bandwidth, "
                     "batch = min(max_batch_size, what fits)):")
        head = ["format"] + [f"@{_k(n)}" for n in p.lengths]
        rows = [[c.format] + [f"{c.decode_step_ms[n]:.2f}" for n in p.lengths] for c in p.formats]
        lines += _table(head, rows)
    lines.append("")
    for ex in p.examples:
        parts = ", ".join(f"{k[:-4]} {v:g} GiB" for k, v in ex.items() if k.endswith("_gib"))
        lines.append(f"KV for {ex['context_len']:,} tokens x batch {ex['batch']}: {parts}")
    lines.append("")
    lines.append(f"Advice ({p.advice_basis}):")
    lines += [f"  - {a}" for a in p.advice]
    lines += [f"Note: {n}" for n in p.notes]
    return "\n".join(lines)


def _k(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
    fmt = "  ".join(f"{{:>{w}}}" if i else f"{{:<{w}}}" for i, w in enumerate(widths))
    out = [fmt.format(*head), fmt.format(*["-" * w for w in widths])]
    out += [fmt.format(*r) for r in rows]
    return out
