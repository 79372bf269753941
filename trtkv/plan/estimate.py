"""`trtkv plan --estimate`: TTFT, ITL and output tokens/s per KV format and concurrency for the
recipe's engine, GPU, TP/PP, weights and bench workload, each figure with its source:
aiconfigurator's estimate where it has data (trtkv.plan.aic), else trtkv's own model
(trtkv.plan.speed); and the largest concurrency the plan's KV pool (Plan.kv_pool_bytes_per_gpu, the
engine's own pool rule: trtkv.plan.engine_pool) holds."""

from __future__ import annotations

from dataclasses import replace

from trtkv.backends import for_recipe
from trtkv.core.errors import TrtkvError
from trtkv.kvcache.formats import UNQUANTIZED, KVFormat
from trtkv.plan import aic
from trtkv.plan.estimate_model import AicFigures, Estimate, EstimateRow
from trtkv.plan.estimate_notes import activation_note, gpu_notes
from trtkv.plan.layer_ops import layer_ops, with_replicated
from trtkv.plan.model import Architecture, resolve_architecture, seq_bytes, weights_bytes
from trtkv.plan.moe_step import POWER_LAW, rank_concurrency, routing_note, with_experts
from trtkv.plan.result import Plan
from trtkv.plan.speed import (
    Kernels,
    KVCost,
    ModelShape,
    Serving,
    kernels_for,
    kv_lane,
    serve,
)
from trtkv.plan.waves import Arrival, arrival_note
from trtkv.platform.hardware import GPU, GPU_SPECS
from trtkv.recipe import Recipe, WeightQuant
from trtkv.recipe.attention import AttentionKind, layer_formats
from trtkv.recipe.backend_rules import SPEED_ENGINE, SPEED_ENGINES
from trtkv.recipe.engine_formats import served_kv_formats
from trtkv.units import GIB

# NVFP4 KV: the GPUs GPUSpec.nvfp4_kv names (SM100/103), as recipe.rules says
NVFP4_ONLY_WHERE = (KVFormat.NVFP4,)


def engine_formats(recipe: Recipe) -> list[tuple[str, KVFormat]]:
    """(label, format) of every KV format the recipe's engine serves
    (recipe.engine_formats.served_kv_formats), the recipe's own first; one 16-bit row (fp16 and bf16
    cost the same), NVFP4 on Blackwell only."""
    out: list[tuple[str, KVFormat]] = [(recipe.kv_format_label, recipe.kv_format)]
    seen = {recipe.kv_format}
    spec = GPU_SPECS.get(recipe.hardware.gpu)
    nvfp4 = spec is not None and spec.nvfp4_kv
    for name in served_kv_formats(recipe.build.backend):
        try:
            fmt = KVFormat(name)
        except ValueError:
            continue
        unq = fmt in UNQUANTIZED and any(f in UNQUANTIZED for f in seen)
        if fmt in seen or unq or (fmt in NVFP4_ONLY_WHERE and not nvfp4):
            continue
        seen.add(fmt)
        out.append((fmt.value, fmt))
    return out


def model_shape(
    arch: Architecture, recipe: Recipe, ep: int | None = None, attention_dp: int | None = None
) -> ModelShape:
    """Per-GPU GEMM parameters and bytes across every pipeline stage (a step's latency crosses all
    of them); a MoE's routed experts priced by what a step touches (trtkv.plan.moe_step). Without
    `ep` and `attention_dp`: the recipe's layout (Recipe.parallelism, `tp` then one attention-DP
    group's); given (a published case's): with build.tp_size as the attention's TP."""
    par, pp = recipe.parallelism, recipe.build.pp_size
    if ep is None and attention_dp is None:
        tp, ep, attention_dp = par.attention_tp, par.ep, par.attention_dp
    else:
        tp, ep, attention_dp = recipe.build.tp_size, ep or 1, attention_dp or 1
    h = arch.hidden_size
    vocab = arch.vocab_size or 0
    params = arch.parameters()
    # the LM head is a GEMM, the lookup not
    gemm_params = max(0.0, params - arch.embedding_parameters() + vocab * h)
    _, w_gpu = weights_bytes(arch, recipe)
    # the embedding table is looked up, not read whole (a tied one is read whole as the LM head)
    lookup = (
        0.0
        if arch.tie_word_embeddings
        else vocab * h * (4 if recipe.model.dtype.value == "float32" else 2) / tp
    )
    fp8 = (
        recipe.quantization.weights in (WeightQuant.FP8, WeightQuant.INT8_SQ)
        and GPU_SPECS[recipe.hardware.gpu].has_fp8
    )
    # the layers that run attention over a cache of their own (as checkpoints.hf_config's
    # attention_layers): a state layer (Mamba, Gated DeltaNet) or a no-cache layer (Nemotron-H's
    # MLP-only, Gemma 4's KV-shared) is left out
    windows = tuple(
        x.window if x.window else None
        for x in arch.layer_list()
        if not x.is_state and x.kind is not AttentionKind.NONE
    )
    shape = ModelShape(
        arch.num_layers,
        h,
        arch.intermediate_size or 4 * h,
        max(1, arch.num_attention_heads // tp),
        arch.head_dim,
        gemm_params / tp,
        max(0.0, w_gpu * pp - lookup),
        "fp8" if fp8 else "bfloat16",
        windows,
        tp,
        pp,
        None,
        *layer_ops(arch),
    )
    return with_replicated(with_experts(shape, arch, recipe, ep, attention_dp), arch, recipe)


def kv_cost(
    arch: Architecture, recipe: Recipe, fmt: KVFormat, skip: tuple[int | str, ...]
) -> KVCost:
    fmts = layer_formats(arch.layer_list(), fmt, skip, recipe.kv_skip_format)
    tp = recipe.parallelism.attention_tp  # the KV heads split over one attention-DP group
    lane, ops = kv_lane(fmt)
    heads = max(1, -(-arch.num_kv_heads // tp)) if not arch.kv_lora_rank else 1
    elems = (
        2 * heads * arch.head_dim
        if not arch.kv_lora_rank
        else float(arch.kv_shape().mla_latent or 0)
    )

    def bytes_at(n: int) -> float:
        return seq_bytes(arch, fmts, n, tp, 1)

    return KVCost(fmt, bytes_at, lane, ops, elems)


def _own_rows(
    recipe: Recipe,
    arch: Architecture,
    label: str,
    kv: KVCost,
    fits: int,
    routing: str | None = None,
) -> list[EstimateRow]:
    b = recipe.bench
    k = kernels_for(recipe.hardware.gpu, SPEED_ENGINE[recipe.build.backend])
    m = model_shape(arch, recipe)
    if routing and m.moe is not None:  # an MoE priced under another routing assumption
        m = replace(m, moe=replace(m.moe, routing=routing))
    rows = []
    groups = recipe.parallelism.attention_dp
    for c in b.concurrency:
        # one attention-DP group runs its share of the replica's sequences (fits: per group)
        s: Serving = serve(
            k,
            m,
            kv,
            b.input_tokens,
            b.output_tokens,
            min(rank_concurrency(c, groups), max(1, fits)),
            recipe.build.max_num_tokens,
        )
        rows.append(
            EstimateRow(
                label,
                c,
                s.ttft_ms,
                s.itl_ms,
                s.itl_p50_ms,
                s.output_tokens_per_s_per_gpu,
                s.output_tokens_per_s_per_user,
                k.source,
                c <= fits * groups,
            )
        )
    return rows


def estimate(recipe: Recipe, plan: Plan, use_aiconfigurator: bool = True) -> Estimate:
    """Every (format, concurrency) of the recipe's engine: aiconfigurator's figures where it has
    them, else trtkv's."""
    gpu = recipe.hardware.gpu
    if gpu is GPU.CPU or recipe.build.backend not in SPEED_ENGINE:
        raise TrtkvError(
            f"recipe {recipe.name}: --estimate prices a GPU engine (hardware.gpu one of "
            f"{', '.join(g.value for g in GPU_SPECS)}, build.backend one of "
            f"{', '.join(b.value for b in SPEED_ENGINE)}); this one runs "
            f"{recipe.build.backend.value} on {gpu.value}. Next: override "
            "them, e.g. `hardware.gpu=H100-80GB build.backend=vllm`, or measure here with `trtkv "
            "bench --sweep-input`."
        )
    arch = resolve_architecture(recipe)
    b = recipe.bench
    # the engine's own rule (memdata): the one figure plan, serve and bench share
    pool = plan.kv_pool_bytes_per_gpu
    skip = tuple(recipe.quantization.kv_skip_layers)
    formats = engine_formats(recipe)
    # the recipe's own row keeps its kv_skip_layers
    costs = {
        label: kv_cost(arch, recipe, fmt, skip if label == recipe.kv_format_label else ())
        for label, fmt in formats
    }
    fits = {
        label: int(pool // kv.seq_bytes(b.input_tokens + b.output_tokens)) if pool else 0
        for label, kv in costs.items()
    }
    answer, status = (
        aic.run_for(recipe, arch, formats, b.concurrency)
        if use_aiconfigurator
        else (None, "not asked (--no-aiconfigurator)")
    )
    own = {label: _own_rows(recipe, arch, label, kv, fits[label]) for label, kv in costs.items()}
    rows, status = one_source_rows(answer, status, formats, b.concurrency, fits, own)
    notes: list[str] = []
    over = sorted({r.format for r in rows if not r.fits})
    if over:
        notes.append(
            f"concurrency above what the KV pool holds ({pool / GIB:.1f} GiB per GPU) for "
            f"{', '.join(over)}: trtkv's model prices those levels at the concurrency that fits "
            "(the engine queues the rest)."
        )
    if any(fmt not in UNQUANTIZED and kv_lane(fmt)[1] for _, fmt in formats):
        notes.append(
            "formats other than 16-bit and FP8 (no kernel tables anywhere): their bytes at the FP8 "
            "attention kernel's measured efficiency, plus dequantization counted per element on "
            "the CUDA cores."
        )
    notes += gpu_notes(gpu, SPEED_ENGINE[recipe.build.backend], rows)
    own_label = recipe.kv_format_label
    own_kv = costs[own_label]
    if any(r.source.startswith("trtkv model") for r in rows) and arch.moe is not None:
        # the routing assumption's effect: the own format's ITL under aiconfigurator's power law
        alt = _own_rows(recipe, arch, own_label, own_kv, fits[own_label], POWER_LAW)
        itl = {
            a.concurrency: (o.itl_ms, a.itl_ms) for o, a in zip(own[own_label], alt, strict=True)
        }
        moe = routing_note(arch, recipe, list(b.concurrency), itl)
        notes += [moe] if moe else []
        notes += activation_note(
            recipe,
            arch,
            own[own_label],
            lambda r: _own_rows(r, arch, own_label, own_kv, fits[own_label]),
        )
    notes.append(arrival_note(recipe, model_shape(arch, recipe), own_kv))
    workload = {
        "input_tokens": b.input_tokens,
        "output_tokens": b.output_tokens,
        "concurrency": list(b.concurrency),
        "max_num_batched_tokens": recipe.build.max_num_tokens,
        "arrival": Arrival.STAGGERED.value,
    }
    if b.output_tokens == 1:
        notes.append(
            "one output token: no inter-token latency (ITL and tok/s/user shown as -, 0 in "
            "--json); TTFT is the whole answer."
        )
    est = Estimate(workload, recipe.build.backend.value, gpu.value, fits, rows, status, notes)
    if b.prefix.enabled:  # bench.prefix: hit rates per tier and their TTFT (#55)
        from trtkv.plan.prefix_reuse import prefix_reuse

        k = kernels_for(gpu, SPEED_ENGINE[recipe.build.backend])
        est.prefix = prefix_reuse(recipe, pool, list(costs.items()), k, model_shape(arch, recipe))
    est.advice = row_advice(est, recipe.kv_format_label, formats)
    est.replaces_advice = speed_advice_prefix(recipe)
    return est


def one_source_rows(
    answer: aic.AicAnswer | None,
    status: str,
    formats: list[tuple[str, KVFormat]],
    levels: list[int],
    fits: dict[str, int],
    own: dict[str, list[EstimateRow]],
) -> tuple[list[EstimateRow], str]:
    """The rows, one source per concurrency level: aiconfigurator's where it answered every format
    at that level, else trtkv's model for every format there, aiconfigurator's figures beside
    (EstimateRow.aiconfigurator, not compared); and the status line, saying once which levels fell
    back and why."""
    if answer is None:
        return [r for label, _ in formats for r in own[label]], status
    # a skip-layer variant of a format (its own label) is not what aiconfigurator priced
    got = {
        (label, c): answer.row_at(fmt, c) if label == fmt.value else None
        for label, fmt in formats
        for c in levels
    }
    theirs = [c for c in levels if all(got[(label, c)] for label, _ in formats)]
    rows = []
    for label, _ in formats:
        for r in own[label]:
            a = got[(label, r.concurrency)]
            if a is None:
                rows.append(r)
            elif r.concurrency in theirs:
                rows.append(
                    EstimateRow(
                        label,
                        a.concurrency,
                        a.ttft_ms,
                        a.itl_ms,
                        None,
                        a.tokens_per_s_per_gpu,
                        a.tokens_per_s_per_user,
                        answer.source(a),
                        a.concurrency <= fits[label],
                    )
                )
            else:
                r.aiconfigurator = AicFigures(
                    a.ttft_ms,
                    a.itl_ms,
                    a.tokens_per_s_per_gpu,
                    a.tokens_per_s_per_user,
                    answer.source(a),
                )
                rows.append(r)
    mine = [c for c in levels if c not in theirs]
    if not mine:
        return rows, status + "; one source per level: aiconfigurator for every row"
    uncovered = [label for label, fmt in formats if label != fmt.value or fmt not in aic.AIC_KV]
    failed = [
        (label, c, answer.failure_at(fmt, c) or "no row")
        for label, fmt in formats
        for c in mine
        if label not in uncovered and got[(label, c)] is None
    ]
    why = []
    if uncovered:
        why.append(
            f"aiconfigurator {answer.version} has no KV data for {', '.join(uncovered)} (it has "
            "bfloat16 and fp8)"
        )
    if failed:
        label, c, err = failed[0]
        more = f" (and {', '.join(f'{f} at {n}' for f, n, _ in failed[1:])})" if failed[1:] else ""
        why.append(f"its {label} case at concurrency {c} failed: {err}{more}")
    said = f"{status}; one source per level: trtkv model for every row at concurrency " + ", ".join(
        str(c) for c in mine
    )
    side = next((r.aiconfigurator.source for r in rows if r.aiconfigurator), None)
    beside = f"; {side}'s figures beside them (aic columns), not compared" if side else ""
    theirs_said = (
        f"; aiconfigurator for every row at concurrency {', '.join(str(c) for c in theirs)}"
        if theirs
        else ""
    )
    return rows, f"{said} ({'; '.join(why)}){beside}{theirs_said}"


def row_advice(est: Estimate, label: str, formats: list[tuple[str, KVFormat]]) -> list[str]:
    """The recipe's KV format against the 16-bit row at each level, read from those two rows (one
    source, which it names); none for a 16-bit recipe."""
    base = next((lab for lab, f in formats if f in UNQUANTIZED), None)
    if base is None or base == label:
        return []
    by = {(r.format, r.concurrency): r for r in est.rows}
    out = []
    for c in est.workload["concurrency"]:
        q, s = by.get((label, c)), by.get((base, c))
        if q is None or s is None or q.source != s.source:
            continue
        w = est.workload
        out.append(
            f"{label} KV vs {base} at concurrency {c} ({w['input_tokens']:,} in, "
            f"{w['output_tokens']:,} out): {itl_change(q.itl_ms, s.itl_ms)}, TTFT "
            f"{q.ttft_ms / s.ttft_ms - 1:+.0%}, output tok/s/GPU "
            f"{q.output_tokens_per_s / s.output_tokens_per_s - 1:+.0%}; both rows {q.source}."
        )
    return out


def kernel_data(recipe: Recipe, k: Kernels) -> str:
    """The kernels' version named as what the data is (aiconfigurator's tables), and the served
    engine's version beside it where they differ (e.g. 1.3.0rc20 tables for a 1.2.1 engine)."""
    label = SPEED_ENGINES[SPEED_ENGINE[recipe.build.backend]].label
    memory = for_recipe(recipe).memory
    served = (memory and memory.release) or recipe.build.tensorrt_llm_version
    data = k.versions.rsplit(" ", 1)[-1]
    if data == served:
        return f"{k.versions} kernels"
    return (
        f"kernel data measured on {label} {data} (aiconfigurator's tables; the served engine is "
        f"{label} {served}, whose kernels may differ)"
    )


def speed_advice_prefix(recipe: Recipe) -> str:
    """How speed_advice's line starts (`plan --estimate` puts the rows' own comparison in its
    place: trtkv.cli.plan)."""
    n = min(recipe.build.max_input_len, 32768)
    return f"At {n:,} tokens in on {recipe.hardware.gpu.value} with "


def itl_change(quant_ms: float, base_ms: float) -> str:
    """`ITL +x%`, or what stands in its place with one output token (no inter-token latency)."""
    return f"ITL {quant_ms / base_ms - 1:+.0%}" if quant_ms and base_ms else "no ITL (one token)"


def speed_advice(recipe: Recipe, arch: Architecture, capacity_ratio: float | None) -> str | None:
    """The planner's advice line on the recipe's KV format against 16-bit, from trtkv's own model
    (no subprocess): ITL and TTFT change at the recipe's longest input (at most 32K) and concurrency
    (at most 8), the capacity ratio, and the concurrency-1 break-even length."""
    gpu, fmt = recipe.hardware.gpu, recipe.kv_format
    if gpu is GPU.CPU or recipe.build.backend not in SPEED_ENGINE or fmt in UNQUANTIZED:
        return None
    b = recipe.bench
    n = min(recipe.build.max_input_len, 32768)  # the long context a quantized cache is chosen for
    c = min(max(b.concurrency), 8)
    k = kernels_for(gpu, SPEED_ENGINE[recipe.build.backend])
    m = model_shape(arch, recipe)
    skip = tuple(recipe.quantization.kv_skip_layers)
    quant, base = kv_cost(arch, recipe, fmt, skip), kv_cost(arch, recipe, KVFormat.BF16, ())
    q, s = (
        serve(k, m, kv, n, b.output_tokens, c, recipe.build.max_num_tokens) for kv in (quant, base)
    )
    lines = {}
    for name, kv in (("q", quant), ("s", base)):
        lo, hi = (
            serve(k, m, kv, x, 128, 1, recipe.build.max_num_tokens).itl_p50_ms
            for x in (1024, 65536)
        )
        lines[name] = ((hi - lo) / 64512, lo - (hi - lo) / 64512 * 1024)
    (sq, iq), (ss, is_) = lines["q"], lines["s"]
    if sq < ss:
        cross = (iq - is_) / (ss - sq)
        even = "at every length" if cross <= 0 else f"beyond ~{cross:,.0f} tokens"
    else:
        even = "never (its ITL slope is not lower)"
    cap = f", capacity x{capacity_ratio:.2g}" if capacity_ratio else ""
    return (
        f"{speed_advice_prefix(recipe)}{kernel_data(recipe, k)}, "
        f"{recipe.kv_format_label} KV "
        f"vs bf16 at concurrency {c}: {itl_change(q.itl_ms, s.itl_ms)}, TTFT "
        f"{q.ttft_ms / s.ttft_ms - 1:+.0%}{cap}; decode (concurrency 1) breaks even {even} "
        f"({k.source}; `trtkv plan {recipe.name} --estimate` for every format and level, `trtkv "
        "bench --sweep-input` measures it)."
    )
