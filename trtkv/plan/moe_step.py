"""The routed experts of a mixture-of-experts step, priced by what the step touches (issue #49).

A step of T tokens per attention-DP rank routes each token to top-k of E experts per MoE layer.
The routing assumption is stated in the output, with its effect (routing_note). The default,
uniform routing (every expert equally likely, tokens independent), reads the standard closed form
E (1 - (1 - k/E)^N) distinct experts per layer over the N tokens the expert group sees (T x
attention DP); under EP each rank holds E / EP of them and the step waits for the busiest rank: the
expected most experts one of the EP ranks reads, each expert touched with the closed form's
probability. The alternative shown beside it is aiconfigurator's power-law expert load
(aiconfigurator-core 0.12.0: workload_distribution "power_law", alpha 1.2 for its generic MoE
models, sdk/models/moe.py), drawn as its collector draws it (collector/helper.py
_generate_power_law_distribution: E per-expert loads from a power law on [1, 0.8 N] when N k > E,
else on [0.01, 2], scaled to N k token-expert pairs and rounded; its table rows time the busiest EP
rank). Uniform stays the default: every published MoE decode figure without EP sits closer under it
(tests/plan/test_published_speed.py asserts it; docs/plan.md gives the figures).

What a step costs here, per GPU:
- routed experts: the distinct experts' weights once (at their stored bytes: gpt-oss MXFP4, a recipe
  quant's bytes, else 16-bit), or the FLOPs of the tokens routed to this rank (N x k / EP tokens
  through one expert's GEMMs), whichever is slower, per MoE layer, plus a fixed cost per layer, at
  the engine's fused MoE op as aiconfigurator-core 0.12.0 measured it for the experts' dtype
  (moe_perf.parquet, fitted per GPU, engine and dtype by tools/aic_kernels.py: memory over its
  balanced rows with a cost per expert touched, compute over its power-law rows), each side read
  from the table's own rows for the expert shape and moe_tp/EP where the GPU has them, as
  aiconfigurator reads them: the memory side from its balanced rows at the experts the busiest
  rank reads, the compute side from its power-law rows at the step's tokens
  (trtkv.plan.moe_tables); where no table covers the dtype, the dense-GEMM efficiencies plus two
  grouped-GEMM calls and the routing kernels per layer;
- attention, dense layers, shared experts, routers and the LM head: trtkv.plan.speed's dense GEMMs
  (the model's active parameters; prefill FLOPs come from them, not from every expert);
- EP with attention DP: tokens live on their DP rank, so each MoE layer dispatches them to the ranks
  that hold their experts and combines the results back, an all-to-all each way over the GPU's
  interconnect (the all-reduce's bus figures); EP without attention DP: after TP attention every
  rank holds every token, each runs its own experts on them and the partial sums join in the
  all-reduce TP already pays, so no all-to-all.
Parallel sizes follow aiconfigurator's terms: `tp` is attention's tensor parallelism inside one DP
group, `attention_dp` the DP groups, tp x attention_dp GPUs per stage = moe_tp x ep.
Not modelled: multi-node wide EP (inter-node all-to-all over RDMA, expert load balancers, redundant
experts), speculative decoding (the accept rate sets the tokens per step), expert offloading.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from trtkv.checkpoints import read_model_facts
from trtkv.core.errors import TrtkvError
from trtkv.engines.sizing import model_config_path
from trtkv.plan.model import WEIGHT_BYTES
from trtkv.plan.moe_tables import RowKernels, decode_row_ms, shape_row_ms
from trtkv.recipe import Recipe, WeightQuant, moe_activations_text, resolved_moe_activations

if TYPE_CHECKING:
    from trtkv.plan.model import Architecture

ROUTING = "uniform"
# aiconfigurator-core 0.12.0's default expert load for gpt-oss, Qwen3-MoE and its other generic MoE
# models (config.py workload_distribution "power_law", models/moe.py _power_law_alpha 1.2)
POWER_LAW_ALPHA = 1.2
POWER_LAW = f"power_law_{POWER_LAW_ALPHA}"  # as aiconfigurator names its table rows
# draws of aiconfigurator's sampler averaged per step shape (seeded: the figure is reproducible)
POWER_LAW_DRAWS = 128
ROUTINGS = {
    ROUTING: (
        "uniform routing (each token's top-k of E experts equally likely, tokens independent: a "
        "step of N tokens reads E (1 - (1 - k/E)^N) distinct experts per MoE layer; under EP the "
        "busiest rank's expected count)"
    ),
    POWER_LAW: (
        f"aiconfigurator's power-law expert load (alpha {POWER_LAW_ALPHA}, its default for generic "
        "MoE models: per-expert loads drawn from a power law, the busiest EP rank's)"
    ),
}
# per MoE layer besides the two grouped GEMMs: top-k/softmax, permute (dispatch order), unpermute
# with the weighted sum; each priced as a memory-bound op's fixed latency (speed.Kernels)
ROUTING_KERNELS = 3
# a stored or recipe weight format -> the expert dtype of aiconfigurator-core 0.12.0's
# moe_perf.parquet rows (weight-only MXFP4 on every GPU: its w4a16 rows; INT8 SmoothQuant: no rows,
# the dense-GEMM efficiencies price it)
# gpt-oss's MXFP4 experts in aiconfigurator's MoE tables: BF16 activations, and MXFP8 ones
MXFP4_TABLE, MXFP8_TABLE = "w4a16_mxfp4", "w4a8_mxfp4_mxfp8"
TABLE_DTYPE = {
    "fp8": "fp8",
    "fp8_block": "fp8_block",
    "nvfp4": "nvfp4",
    "mxfp4": MXFP4_TABLE,
    "int4_awq": "int4_wo",
    "unquantized": "bfloat16",
}


class StepKernels(RowKernels, Protocol):
    """What the expert step reads of speed.Kernels (typed by shape: speed imports this module)."""

    @property
    def backend(self) -> str: ...
    @property
    def mem_bw(self) -> float: ...
    @property
    def flops(self) -> dict[str, float]: ...
    @property
    def gemm_fixed_ms(self) -> dict[str, float]: ...
    @property
    def link_bw(self) -> float: ...
    @property
    def ar_floor_ms(self) -> float: ...
    @property
    def ar_bus_eff(self) -> float: ...
    @property
    def op_latency_ms(self) -> float: ...
    @property
    def moe_tables(self) -> dict[str, dict[str, Any]]: ...
    def efficiency(self, kind: str, dtype: str) -> float: ...


class DenseShape(Protocol):
    """What with_experts changes of a speed.ModelShape."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def tp(self) -> int: ...
    @property
    def gemm_params(self) -> float: ...
    @property
    def weight_bytes(self) -> float: ...


Shape = TypeVar("Shape", bound=DenseShape)


@dataclass(frozen=True)
class MoEShape:
    """The routed experts of one model as one engine step runs them, per GPU."""

    layers: int  # MoE layers (every pipeline stage: a step crosses all)
    experts: int  # E
    top_k: int  # k
    expert_params: float  # one expert of one layer (its gate, up and down matrices), unsharded
    bytes_per_param: float  # as stored or quantized, scales included
    dtype: str  # the GEMM lane the experts run in ("bfloat16" or "fp8")
    hidden: int
    tp: int = 1  # attention TP inside one DP group
    ep: int = 1
    attention_dp: int = 1
    routing: str = ROUTING
    table: str = "bfloat16"  # the experts' dtype in aiconfigurator's MoE tables (TABLE_DTYPE)
    activations: str = "bf16"  # MXFP4 experts' activations (trtkv.recipe.moe_activations)

    @property
    def moe_tp(self) -> int:
        """Each expert's tensor-parallel shards: tp x attention_dp GPUs = moe_tp x ep."""
        return max(1, self.tp * self.attention_dp // self.ep)

    @property
    def total_params(self) -> float:
        return self.layers * self.experts * self.expert_params


def check_parallel(tp: int, ep: int, attention_dp: int, experts: int) -> None:
    """EP must divide tp x attention_dp and the experts (aiconfigurator's rule, engines' too)."""
    gpus = tp * attention_dp
    if ep < 1 or attention_dp < 1 or gpus % ep or experts % ep:
        raise TrtkvError(
            f"expert parallel size {ep} with tp {tp} x attention DP {attention_dp}: EP must be >= "
            f"1 and divide both the {gpus} GPUs per stage and the model's {experts} experts "
            "(tp x attention_dp = moe_tp x ep). Next: pick an EP among "
            f"{', '.join(str(d) for d in range(1, gpus + 1) if not gpus % d and not experts % d)}."
        )


def distinct_experts(experts: int, top_k: int, tokens: float) -> float:
    """Expected distinct experts of E that N tokens touch, each choosing k distinct ones uniformly:
    E (1 - (1 - k/E)^N)."""
    if tokens <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - min(top_k, experts) / experts) ** tokens)


def rank_load(
    experts: int, top_k: int, tokens: int, ep: int = 1, routing: str = ROUTING
) -> tuple[float, float]:
    """(distinct experts the busiest EP rank reads, token-expert pairs routed to it) in a step of
    `tokens` tokens, under `routing` (ROUTINGS)."""
    if tokens <= 0:
        return 0.0, 0.0
    if routing == ROUTING:
        return _busiest_uniform(experts, top_k, tokens, ep), tokens * top_k / ep
    if routing == POWER_LAW:
        return _power_law(experts, top_k, tokens, ep, POWER_LAW_ALPHA)
    raise TrtkvError(
        f"MoE routing assumption {routing!r}: not one trtkv prices. Allowed: "
        f"{', '.join(ROUTINGS)}. Next: use one of those (trtkv.plan.moe_step.ROUTINGS)."
    )


@functools.lru_cache(maxsize=4096)
def _busiest_uniform(experts: int, top_k: int, tokens: int, ep: int) -> float:
    """Uniform routing: the expected most distinct experts one of `ep` ranks (E / ep experts each)
    reads, each expert touched independently with the closed form's probability (one rank: the
    closed form)."""
    if ep <= 1:
        return distinct_experts(experts, top_k, tokens)
    p = distinct_experts(experts, top_k, tokens) / experts
    group = experts // ep
    if p >= 1.0:
        return float(group)
    # the binomial's terms in logs: a large group's coefficient overflows a float
    lp, lq, lg = math.log(p), math.log1p(-p), math.lgamma(group + 1)
    pmf = [
        math.exp(lg - math.lgamma(i + 1) - math.lgamma(group - i + 1) + i * lp + (group - i) * lq)
        for i in range(group + 1)
    ]
    expected, below = 0.0, 0.0
    for j in range(1, group + 1):  # E[max] = sum over j of P(max >= j) = 1 - P(each rank < j)
        below += pmf[j - 1]
        expected += 1.0 - min(1.0, below) ** ep
    return expected


@functools.lru_cache(maxsize=4096)
def _power_law(experts: int, top_k: int, tokens: int, ep: int, alpha: float) -> tuple[float, float]:
    """aiconfigurator's power-law expert load as its collector draws it (module docstring), the
    busiest EP rank's distinct experts and token-expert pairs, averaged over POWER_LAW_DRAWS seeded
    draws. Two departures, both physical: an expert takes at most `tokens` of them (a token
    reaches an expert once; the excess goes to the next-heaviest experts), and the rounding's
    remainder goes to the heaviest draws (aiconfigurator's goes to the first of the tied zeros)."""
    rng = random.Random(0)
    pairs = tokens * top_k
    lo, hi = (1.0, 0.8 * tokens) if pairs > experts else (0.01, 2.0)
    a = 1.0 - alpha
    group = experts // ep
    seen_sum = pairs_sum = 0.0
    for _ in range(POWER_LAW_DRAWS):
        x = [((hi**a - lo**a) * rng.random() + lo**a) ** (1 / a) for _ in range(experts)]
        total = sum(x)
        load = [round(v / total * pairs) for v in x]
        order = sorted(range(experts), key=lambda i: (-load[i], -x[i]))
        left = pairs - sum(load)
        for i in range(left):  # short: one more each to the heaviest
            load[order[i % experts]] += 1
        i = 0
        while left < 0:  # over: one fewer each from the lightest that hold any
            j = order[-1 - i % experts]
            i += 1
            if load[j] > 0:
                load[j] -= 1
                left += 1
        spill = sum(max(0, n - tokens) for n in load)
        load = [min(n, tokens) for n in load]
        for j in sorted(range(experts), key=lambda i: -x[i]):
            if spill <= 0:
                break
            add = min(tokens - load[j], spill)
            load[j] += add
            spill -= add
        ranks = [load[r * group : (r + 1) * group] for r in range(ep)]
        busiest = max(ranks, key=sum)
        seen_sum += sum(1 for n in busiest if n)
        pairs_sum += sum(busiest)
    return seen_sum / POWER_LAW_DRAWS, pairs_sum / POWER_LAW_DRAWS


def routed_ms(k: StepKernels, moe: MoEShape, tokens: int) -> tuple[float, float]:
    """(expert GEMM ms, all-to-all ms) of one step whose attention-DP rank runs `tokens` tokens:
    the busiest EP rank's experts under the shape's routing assumption."""
    if tokens <= 0:
        return 0.0, 0.0
    seen = tokens * moe.attention_dp  # the tokens the expert group sees
    local, pairs = rank_load(moe.experts, moe.top_k, seen, moe.ep, moe.routing)
    shard = moe.expert_params / moe.moe_tp
    read = local * shard * moe.bytes_per_param
    flops = 2 * pairs * shard
    table = moe.table
    if table == MXFP4_TABLE and moe.activations == "mxfp8":
        # MXFP4 experts with MXFP8 activations (trtkv.recipe.moe_activations): those rows where the
        # GPU's tables have them
        table = MXFP8_TABLE if MXFP8_TABLE in k.moe_tables else table
    fused = k.moe_tables.get(table)
    if fused is not None:
        # the engine's fused MoE op as aiconfigurator measured it (tools/aic_kernels.py: its
        # fixed cost per layer, memory and compute efficiencies)
        mem = read / (k.mem_bw * min(1.0, fused["mem_efficiency"])) * 1e3
        mem += local * fused.get("per_expert_ms", 0.0)  # each expert touched: its own GEMM set-up
        comp = flops / (fused["peak_flops"] * min(1.0, fused["compute_efficiency"])) * 1e3
        # the shape's own rows where the table has them, fixed cost included: the experts read, the
        # tokens computed
        read_ms = decode_row_ms(k, moe, table, local)
        row = shape_row_ms(k, moe, table, seen)
        gemm = moe.layers * max(
            read_ms if read_ms is not None else fused["fixed_ms"] + mem,
            row if row is not None else fused["fixed_ms"] + comp,
        )
    else:
        mem = read / (k.mem_bw * k.efficiency("gemm_memory", moe.dtype)) * 1e3
        mem += 2 * k.gemm_fixed_ms.get(f"gemm_memory.{moe.dtype}", 0.0)
        comp = flops / (k.flops[moe.dtype] * k.efficiency("gemm_compute", moe.dtype)) * 1e3
        comp += 2 * k.gemm_fixed_ms.get(f"gemm_compute.{moe.dtype}", 0.0)
        gemm = moe.layers * (max(mem, comp) + ROUTING_KERNELS * k.op_latency_ms)
    comm = 0.0
    if moe.ep > 1 and moe.attention_dp > 1:
        # each token goes to the distinct ranks holding its k experts, (ep - 1) / ep of them
        # remote; 16-bit hidden states, dispatch and combine
        ranks = moe.ep * (1.0 - (1.0 - 1.0 / moe.ep) ** moe.top_k)
        sent = tokens * moe.hidden * 2 * ranks * (moe.ep - 1) / moe.ep
        one = k.ar_floor_ms + sent / (k.link_bw * k.ar_bus_eff) * 1e3
        comm = moe.layers * 2 * one
    return gemm, comm


def rank_concurrency(concurrency: int, attention_dp: int) -> int:
    """Sequences one attention-DP rank runs: the engines spread requests evenly."""
    return max(1, math.ceil(concurrency / max(1, attention_dp)))


def expert_bytes(
    arch: Architecture, recipe: Recipe, dtype_bytes: float
) -> tuple[float, str, str, str]:
    """(bytes per routed-expert weight, GEMM lane, where it comes from, the dtype aiconfigurator's
    MoE tables name it by): a pre-quantized checkpoint as stored (its quantization_config), else
    the recipe's weight quantization, else 16-bit."""
    quant = recipe.quantization.weights
    if quant is WeightQuant.NONE and arch.stored_weights_bytes:
        path = model_config_path(recipe)
        stored = read_model_facts(path).quant if path is not None else None
        if stored is not None:
            lane = "fp8" if stored.method == "fp8" else "bfloat16"
            fmt = stored.formats.get("experts") or stored.stored_format or ""
            return stored.weight_bytes, lane, stored.source, TABLE_DTYPE.get(fmt, "")
    if quant in WEIGHT_BYTES:
        lane = "fp8" if quant in (WeightQuant.FP8, WeightQuant.INT8_SQ) else "bfloat16"
        table = TABLE_DTYPE.get(quant.value, "")
        return WEIGHT_BYTES[quant], lane, f"quantization.weights {quant.value}", table
    return dtype_bytes, "bfloat16", f"model.dtype {recipe.model.dtype.value}", "bfloat16"


def activation_problem(arch: Architecture, recipe: Recipe) -> str | None:
    """build.moe_activations asked of a model whose routed experts are not MXFP4 (the only
    experts the choice exists for)."""
    chosen = recipe.build.moe_activations
    if chosen == "auto" or arch.moe is None or not arch.expert_parameters:
        return None
    _, _, source, table = expert_bytes(arch, recipe, 2.0)
    if table == MXFP4_TABLE:
        return None
    return (
        f"{recipe.path}: build.moe_activations {chosen}: it applies to MXFP4 experts "
        f"(gpt-oss's); {arch.source}'s routed experts are {table or 'of another format'} (from "
        f"{source}). Next: set build.moe_activations auto."
    )


def moe_shape(
    arch: Architecture, recipe: Recipe, tp: int, ep: int = 1, attention_dp: int = 1
) -> MoEShape | None:
    """The recipe's routed experts, or None for a dense model."""
    moe = arch.moe
    if moe is None or not arch.expert_parameters:
        return None
    check_parallel(tp, ep, attention_dp, moe.num_experts)
    layers = len(moe.moe_layers)
    per = arch.expert_parameters / max(1, layers * moe.num_experts)
    dtype_bytes = 4.0 if recipe.model.dtype.value == "float32" else 2.0
    bpp, lane, _, table = expert_bytes(arch, recipe, dtype_bytes)
    return MoEShape(
        layers,
        moe.num_experts,
        moe.experts_per_token,
        per,
        bpp,
        lane,
        arch.hidden_size,
        tp,
        ep,
        attention_dp,
        table=table,
        activations=resolved_moe_activations(recipe),
    )


def routing_note(
    arch: Architecture,
    recipe: Recipe,
    levels: list[int],
    itl: dict[int, tuple[float, float]] | None = None,
) -> str | None:
    """The output's statement of the routing assumption and its effect at the recipe's levels:
    the experts a decode step reads under it and under aiconfigurator's power law, and `itl`
    (concurrency -> ITL ms under each) where the caller priced both."""
    par = recipe.parallelism
    moe = moe_shape(arch, recipe, par.attention_tp, par.ep, par.attention_dp)
    if moe is None:
        return None
    bpp, _, source, _ = expert_bytes(arch, recipe, 2.0)
    levels = sorted(set(levels))

    def reads(routing: str) -> list[str]:
        out = []
        for c in levels:
            seen = rank_concurrency(c, moe.attention_dp) * moe.attention_dp
            out.append(f"{rank_load(moe.experts, moe.top_k, seen, moe.ep, routing)[0]:.0f}")
        return out

    rank = f" on the busiest of {moe.ep} EP ranks ({moe.experts // moe.ep} experts each)"
    act = f"; {moe_activations_text(recipe)}" if moe.table == MXFP4_TABLE else ""
    shares = ", ".join(f"concurrency {c}: {n}" for c, n in zip(levels, reads(ROUTING), strict=True))
    effect = ", ".join(reads(POWER_LAW))
    if itl:
        effect += " and ITL " + ", ".join(
            f"{itl[c][0]:.2f} -> {itl[c][1]:.2f} ms ({itl[c][1] / itl[c][0] - 1:+.0%})"
            for c in levels
            if c in itl and itl[c][0]
        )
    return (
        f"MoE ({moe.experts} routed experts, top {moe.top_k}, {moe.layers} layers, experts at "
        f"{bpp:.3g} B/weight from {source}{act}): a decode step reads only the experts its tokens "
        f"route to, under {ROUTINGS[ROUTING]}; distinct experts per layer read in a decode step"
        f"{rank if moe.ep > 1 else ''}: {shares} of {moe.experts // moe.ep}. Under "
        f"{ROUTINGS[POWER_LAW]} they would be {effect} (uniform stays the default: the published "
        "measurements without EP bear it out, docs/plan.md). Prefill FLOPs are the active "
        "parameters', at the fused "
        "MoE op's efficiency under aiconfigurator's power-law expert load; multi-node wide EP and "
        "speculative decoding are not modelled."
    )


def with_experts(
    m: Shape, arch: Architecture, recipe: Recipe, ep: int = 1, attention_dp: int = 1
) -> Shape:
    """A speed.ModelShape with its routed experts taken out of the dense GEMMs and priced by
    routed_ms instead (a dense model's shape unchanged)."""
    moe = moe_shape(arch, recipe, m.tp, ep, attention_dp)
    if moe is None:
        return m
    total = moe.total_params
    return replace(
        m,
        gemm_params=max(0.0, m.gemm_params - total / m.tp),
        # the experts as the recipe's weights hold them: over every GPU of its layout
        # (trtkv.engines.parallel: tp x attention_dp under attention DP)
        weight_bytes=max(
            0.0,
            m.weight_bytes - total * moe.bytes_per_param / (m.tp * recipe.parallelism.attention_dp),
        ),
        moe=moe,
    )
