"""The KV memory planner: bytes per token and per sequence summed layer by layer, what fits in the
pool the recipe's engine allocates (trtkv.plan.engine_pool), and advice (formulas: docs/plan.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from trtkv.core.errors import RecipeError
from trtkv.engines import PARALLEL_NOTE, check_moe, sequence_groups
from trtkv.engines import kv_tp as kv_tp_of
from trtkv.engines.pool import EngineKnobs, EngineTokens, PoolEstimate, TokenFacts
from trtkv.engines.vllm_blocks import hybrid_block_size
from trtkv.kvcache.formats import KVFormat
from trtkv.plan.advice import advice_for, attention_notes, format_row_note, unit_scale_note
from trtkv.plan.concurrency import concurrency
from trtkv.plan.engine_pool import memory_rule, recipe_pool
from trtkv.plan.model import (
    PLAN_FORMATS,
    PLAN_LENGTHS,
    Architecture,
    accounting_label,
    kv_format_for_recipe,
    recipe_accounting,
    resolve_architecture,
    seq_bytes,
    weights_bytes,
)
from trtkv.plan.moe_step import activation_problem
from trtkv.plan.prefix import advice as prefix_advice
from trtkv.plan.prefix import prefix_capacity
from trtkv.plan.result import (
    FormatCapacity,
    Plan,
    PlanAttention,
    PlanExample,
    PlanHardware,
    PlanKVPool,
    PlanModel,
    PlanState,
    PlanTerm,
    PlanWeights,
)
from trtkv.plan.tiers import tier_capacity
from trtkv.platform.hardware import GPU, GPU_SPECS
from trtkv.platform.host import host_memory_gib
from trtkv.recipe import KVCacheQuant, Recipe, WeightQuant
from trtkv.recipe.attention import (
    Accounting,
    AttentionKind,
    LayerAttention,
    bytes_by_attention,
    layer_formats,
    vllm_hybrid_on,
)
from trtkv.recipe.attention import summary as layer_summary
from trtkv.recipe.backend_rules import build_notes
from trtkv.units import GIB


def attn_head_note(arch: Architecture) -> str:
    """fp8_attn_head costs what fp8 costs per token; its scales are a fixed per-(layer, KV head)
    table, said in bytes."""
    k_v_scales = 2 * arch.num_layers * arch.num_kv_heads
    return (
        "fp8_attn_head is priced as fp8: FP8 E4M3 K/V, 1 byte per element, and nothing per token; "
        "its scales are static, one float32 k_scale and v_scale per (layer, KV head): "
        f"{k_v_scales} values = {k_v_scales * 4:,} bytes in the checkpoint (fp8: "
        f"{2 * arch.num_layers}, one k and one v per layer), not in the KV pool's per-token bytes."
    )


def plan(recipe: Recipe, probe_dir: Path | None = None) -> Plan:
    arch = resolve_architecture(recipe)
    hw = recipe.hardware
    tp, pp = recipe.build.tp_size, recipe.build.pp_size
    par = recipe.parallelism
    if par.active and arch.source != "recipe":
        check_moe(recipe, arch.moe is not None, arch.source)
    wrong_activations = activation_problem(arch, recipe)
    if wrong_activations:
        raise RecipeError([wrong_activations], header="An MoE choice the model cannot take")
    # the KV heads split over one attention-DP group's TP; each group holds its own sequences
    kv_tp, groups = kv_tp_of(par), sequence_groups(par)
    on_cpu = hw.gpu is GPU.CPU
    spec = None if on_cpu else GPU_SPECS[hw.gpu]
    memory_gib = hw.memory_gib or (spec.memory_gib if spec else None)
    bandwidth = hw.hbm_bandwidth_gbps or (spec.hbm_bandwidth_gbps if spec else None)
    w_total, w_gpu = weights_bytes(arch, recipe)
    notes: list[str] = []
    if arch.source == "recipe" and not recipe.model.source.startswith("packaged:"):
        from trtkv.checkpoints.models import source_problem

        missing = source_problem(recipe)
        if missing:
            notes.append(f"{missing}; planned from the recipe's model fields alone.")
    if par.active:
        notes.append(
            f"{par.label()}: weights {w_gpu / GIB:.1f} GiB/GPU with the experts spread over "
            f"{par.gpus} GPUs and the rest held by each of {groups} attention-DP group(s); KV "
            f"heads split over TP{kv_tp} within a group, each group keeping its own sequences; "
            f"{PARALLEL_NOTE} (trtkv.engines.parallel)."
        )
    if memory_gib is None:
        memory_gib = host_memory_gib()
        notes.append(
            f"hardware.gpu is cpu: capacity uses this host's RAM ({memory_gib:.1f} GiB); "
            f"set hardware.memory_gib to plan for another machine."
        )
    if memory_gib is not None and not hw.memory_gib and not on_cpu:
        recipe = recipe.model_copy(
            update={"hardware": hw.model_copy(update={"memory_gib": memory_gib})}
        )
    pool = recipe_pool(recipe, arch)
    mem_knobs = memory_rule(recipe).knobs(recipe)
    budget = pool.pool_bytes
    if pool.available_bytes <= 0 and pool.bound != "pin":
        notes.append(
            f"{pool.engine} leaves no memory for the KV pool: weights ({w_gpu / GIB:.1f} GiB/GPU), "
            f"activation and the engine's own buffers exceed what {pool.knob} {pool.knob_value:g} "
            f"hands it on {memory_gib or 0:g} GiB: raise tp_size/pp_size, quantize the weights or "
            "raise the knob."
        )
    lengths = sorted({*PLAN_LENGTHS, recipe.build.max_seq_len})
    rec_fmt = kv_format_for_recipe(recipe)
    formats = list(PLAN_FORMATS)
    if rec_fmt not in formats and rec_fmt is recipe.kv_format:
        formats.insert(0, rec_fmt)
    caps = []
    skip = tuple(recipe.quantization.kv_skip_layers)
    rows: list[tuple[str, KVFormat, tuple[int | str, ...]]] = [(f.value, f, ()) for f in formats]
    # the recipe's mixed (or named: fp8_attn_head) format, first; one its engine runs at scale 1.0
    # (fp8 as fp8_scale1) in place of the plain row of its name
    if skip or recipe.kv_format_label != rec_fmt.value:
        labelled = (recipe.kv_format_label, rec_fmt, skip)
        plain = [i for i, r in enumerate(rows) if r[0] == labelled[0]]
        if plain:
            rows[plain[0]] = labelled
        else:
            rows.insert(0, labelled)
    if recipe.quantization.kv_cache is KVCacheQuant.FP8_ATTN_HEAD:
        notes.append(attn_head_note(arch))
    unit_scale = unit_scale_note(recipe, rec_fmt)
    if unit_scale:
        notes.append(unit_scale)
    accounting, block = recipe_accounting(recipe)
    acc_label = accounting_label(recipe, accounting)
    mnbt = recipe.build.max_num_tokens
    token_unit = memory_rule(recipe).tokens
    unit_rule = ""
    for label, fmt, skipped in rows:
        fmts = layer_formats(arch.layer_list(), fmt, skipped, recipe.kv_skip_format)
        # per token: the KV (a hybrid's state is per sequence)
        bpt = seq_bytes(arch, fmts, 1, with_state=False)
        bpt_gpu = seq_bytes(arch, fmts, 1, kv_tp, pp, with_state=False)
        by_acc = {
            a.value: {n: seq_bytes(arch, fmts, n, 1, 1, a, mnbt, block) for n in lengths}
            for a in Accounting
        }
        seq = by_acc[accounting.value]
        seq_gpu = {n: seq_bytes(arch, fmts, n, kv_tp, pp, accounting, mnbt, block) for n in lengths}
        # what a decode step reads
        read_gpu = {n: seq_bytes(arch, fmts, n, kv_tp, pp) for n in lengths}
        tokens = int(budget // bpt_gpu) if budget else 0
        unit = engine_token(arch, fmts, recipe, bpt_gpu, token_unit)
        unit_rule = unit_rule or unit.rule
        max_seqs = {n: groups * int(budget // seq_gpu[n]) if budget else 0 for n in lengths}
        gib = {n: recipe.build.max_batch_size * seq[n] / GIB for n in lengths}
        step = {}
        if bandwidth:
            for n in lengths:
                batch = max(1, min(recipe.build.max_batch_size, max_seqs[n] or 1))
                # one GPU reads its attention-DP group's share of the batch
                share = -(-batch // groups)
                step[n] = (w_gpu + share * read_gpu[n]) / (bandwidth * 1e9) * 1e3
        caps.append(
            FormatCapacity(
                format=label,
                bytes_per_token=bpt,
                bytes_per_token_per_gpu=bpt_gpu,
                tokens_per_gpu_budget=tokens,
                max_sequences=max_seqs,
                kv_gib_at_max_batch=gib,
                decode_step_ms=step,
                accounting=acc_label,
                per_sequence_kv_bytes=seq,
                per_sequence_kv_bytes_per_gpu=seq_gpu,
                per_sequence_kv_bytes_by_accounting=by_acc,
                tokens_fit={n: max_seqs[n] * n for n in lengths},
                bytes_by_attention={
                    n: bytes_by_attention(arch.layer_list(), arch.kv_shape(), fmts, n)
                    for n in lengths
                },
                engine_bytes_per_token_per_gpu=unit.bytes_per_token,
                engine_tokens_per_gpu=int(budget // unit.bytes_per_token)
                if budget and unit.bytes_per_token
                else 0,
            )
        )
    examples = [
        PlanExample(
            context_len=n,
            batch=batch,
            kv_gib={
                c.format: round(
                    batch * c.per_sequence_kv_bytes.get(n, n * c.bytes_per_token) / GIB, 3
                )
                for c in caps
            },
        )
        for n, batch in ((32768, 8), (recipe.build.max_seq_len, recipe.build.max_batch_size))
    ]
    advice, basis = advice_for(
        recipe, arch, caps, rec_fmt, spec is not None and spec.has_fp8, probe_dir
    )
    from trtkv.measures.probe_results import per_layer_advice

    mixed = per_layer_advice(recipe, probe_dir)
    if mixed:
        advice = [*advice, mixed]
    prefix = prefix_capacity(recipe, caps)
    own = next(c for c in caps if c.format == recipe.kv_format_label)
    conc = concurrency(
        recipe,
        arch,
        budget,
        own.max_sequences[recipe.build.max_seq_len],
        own.tokens_per_gpu_budget,
    )
    advice = [*advice, *prefix_advice(recipe, prefix), *build_notes(recipe)]
    return Plan(
        recipe=recipe.name,
        model=PlanModel.of(arch),
        hardware=PlanHardware(
            gpu=hw.gpu,
            count=hw.count,
            memory_gib=memory_gib,
            hbm_bandwidth_gbps=bandwidth,
            tp_size=tp,
            pp_size=pp,
        ),
        weights=PlanWeights(
            precision=_weights_label(arch, recipe), total_gib=w_total / GIB, per_gpu_gib=w_gpu / GIB
        ),
        kv_pool=plan_kv_pool(pool, mem_knobs),
        kv_pool_bytes_per_gpu=budget,
        kv_budget_gib_per_gpu=budget / GIB,
        recipe_kv_format=recipe.kv_format_label,
        lengths=lengths,
        formats=caps,
        examples=examples,
        advice=advice,
        advice_basis=basis,
        notes=notes + [n for n in [format_row_note(recipe)] if n] + attention_notes(arch, recipe),
        attention=_attention_facts(arch, acc_label, mnbt, block, tp, rec_fmt),
        prefix_cache=prefix,
        concurrency=conc,
        engine_token_rule=unit_rule,
        kv_tiers=tier_capacity(recipe, caps),  # a host tier's capacity per format (#55)
    )


# beyond every window: what a token adds there is the full-attention layers' bytes
BEYOND_WINDOWS = 1 << 22


def engine_token(
    arch: Architecture,
    fmts: list[KVFormat],
    recipe: Recipe,
    every_layer: float,
    token_unit: Callable[[TokenFacts], EngineTokens] | None,
) -> EngineTokens:
    """What one token of the recipe's engine's printed token count holds on the fullest GPU (its
    MemoryRule.tokens; the exact every-layer token where the engine names none)."""
    if token_unit is None:
        return EngineTokens(every_layer, "a token in every layer (the exact account)")
    b = recipe.build
    tp, pp = b.tp_size, b.pp_size
    step = 1024
    far = seq_bytes(arch, fmts, BEYOND_WINDOWS, tp, pp, with_state=False)
    full = (seq_bytes(arch, fmts, BEYOND_WINDOWS + step, tp, pp, with_state=False) - far) / step
    accounting, block = recipe_accounting(recipe)
    return token_unit(
        TokenFacts(
            every_layer_bytes=every_layer,
            full_layers_bytes=full,
            sequence_bytes=lambda n: seq_bytes(
                arch, fmts, n, tp, pp, accounting, b.max_num_tokens, block
            ),
            max_seq_len=b.max_seq_len,
            model_type=arch.model_type,
        )
    )


def plan_kv_pool(pool: PoolEstimate, knobs: EngineKnobs) -> PlanKVPool:
    """The engine rule's figures as plan --json gives them."""
    return PlanKVPool(
        engine=pool.engine,
        version=pool.version,
        rule=pool.rule,
        source=pool.source,
        knob=knobs.flag,
        knob_value=knobs.value,
        knob_is_default=knobs.is_default,
        cap_flag=knobs.cap_flag,
        cap_value=knobs.cap_value,
        budget_bytes=pool.budget_bytes,
        terms=tuple(PlanTerm(name=t.name, bytes=t.bytes, note=t.note) for t in pool.terms),
        available_bytes=pool.available_bytes,
        pool_bytes=pool.pool_bytes,
        bound=pool.bound,
        notes=pool.notes,
    )


def _weights_label(arch: Architecture, recipe: Recipe) -> str:
    if recipe.quantization.weights is WeightQuant.NONE and arch.stored_weights_bytes:
        return "as stored"
    return recipe.quantization.weights.value


def _attention_facts(
    arch: Architecture,
    label: str,
    mnbt: int,
    block: int,
    tp: int = 1,
    fmt: KVFormat = KVFormat.BF16,
) -> PlanAttention:
    layers = arch.layer_list()
    kv_layers = [x for x in layers if not x.is_state and x.kind is not AttentionKind.NONE]
    return PlanAttention(
        layers=tuple(x.label for x in layers),
        summary=layer_summary(layers),
        source=arch.attention_source,
        mla_latent_elements=arch.kv_shape().mla_latent,
        sinks=arch.sinks,
        accounting=label,
        max_num_batched_tokens=mnbt,
        vllm_block_size=block,
        vllm_hybrid_manager=vllm_hybrid_on(layers),
        kv_layers=len(kv_layers),
        state=_state_facts(arch, kv_layers, block, tp, fmt),
    )


def _state_facts(
    arch: Architecture, kv_layers: list[LayerAttention], block: int, tp: int, fmt: KVFormat
) -> PlanState | None:
    """A hybrid's state layers: their fixed state per sequence and the attention block vLLM aligns
    to it."""
    if arch.state is None:
        return None
    shape = arch.kv_shape()
    state_layers = [x for x in arch.layer_list() if x.is_state]
    per_gpu_page = shape.sequence_state_bytes(state_layers[0], tp)
    return PlanState(
        kind=arch.state.kind.value,
        layers=len(state_layers),
        conv_dtype=arch.state_dtypes[0],
        recurrent_dtype=arch.state_dtypes[1],
        dtype_source=arch.state_dtype_source,
        bytes_per_layer=shape.sequence_state_bytes(state_layers[0]),
        bytes_per_sequence=sum(shape.sequence_state_bytes(x) for x in state_layers),
        bytes_per_sequence_per_gpu=sum(shape.sequence_state_bytes(x, tp) for x in state_layers),
        vllm_attention_block=hybrid_block_size(
            block, [shape.bytes_per_token(x, fmt, tp) for x in kv_layers[:1]], [per_gpu_page]
        ),
        source=arch.state.source,
    )
