"""The routed experts of a mixture-of-experts step, priced by what the step touches (issue #49).

A step of T tokens per attention-DP rank routes each token to top-k of E experts per MoE layer.
Under uniform routing (every expert equally likely, tokens independent) the expected distinct
experts one layer reads over the step's tokens is the standard closed form E (1 - (1 - k/E)^N), N
the tokens the expert group sees (T x attention DP); each EP rank holds E / EP of them, so it reads
its share of that. Real routers are skewed (aiconfigurator assumes a power law): skew touches fewer
distinct experts at a small batch (uniform is then an upper bound on bytes) but loads the busiest
rank more at a large one; the output says which assumption priced it and what it changed.

What a step costs here, per GPU:
- routed experts: the distinct experts' weights once (at their stored bytes: gpt-oss MXFP4, a recipe
  quant's bytes, else 16-bit), or the FLOPs of the tokens routed to this rank (N x k / EP tokens
  through one expert's GEMMs), whichever is slower, per MoE layer, plus a fixed cost per layer, at
  the engine's fused MoE op as aiconfigurator-core 0.12.0 measured it for the experts' dtype
  (moe/<engine>/<version>/moe_perf.parquet, fitted per GPU, engine and dtype by
  tools/aic_kernels.py: the memory side over its balanced rows, with a cost per expert touched
  beside the bytes (SGLang's MXFP4 kernel: ~4 us on H200), the compute side over its
  power-law rows, so a prefill's busiest expert is in it); where no table covers the dtype, the
  dense-GEMM efficiencies plus two grouped-GEMM calls and the routing kernels (top-k, permute,
  unpermute) per layer;
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

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from trtkv.checkpoints import read_model_facts
from trtkv.core.errors import TrtkvError
from trtkv.engines.sizing import model_config_path
from trtkv.plan.model import WEIGHT_BYTES
from trtkv.recipe import SPEED_ENGINES, Recipe, WeightQuant

if TYPE_CHECKING:
    from trtkv.plan.model import Architecture

ROUTING = "uniform"
ROUTING_TEXT = (
    "uniform routing (each token's top-k of E experts equally likely, tokens independent: a step "
    "of N tokens reads E (1 - (1 - k/E)^N) distinct experts per MoE layer)"
)
# per MoE layer besides the two grouped GEMMs: top-k/softmax, permute (dispatch order), unpermute
# with the weighted sum; each priced as a memory-bound op's fixed latency (speed.Kernels)
ROUTING_KERNELS = 3
# a stored or recipe weight format -> the expert dtype of aiconfigurator-core 0.12.0's
# moe_perf.parquet rows (weight-only MXFP4 on every GPU: its w4a16 rows; INT8 SmoothQuant: no rows,
# the dense-GEMM efficiencies price it)
TABLE_DTYPE = {
    "fp8": "fp8",
    "fp8_block": "fp8_block",
    "nvfp4": "nvfp4",
    "mxfp4": "w4a16_mxfp4",
    "int4_awq": "int4_wo",
    "unquantized": "bfloat16",
}


class StepKernels(Protocol):
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


def routed_ms(k: StepKernels, moe: MoEShape, tokens: int) -> tuple[float, float]:
    """(expert GEMM ms, all-to-all ms) of one step whose attention-DP rank runs `tokens` tokens."""
    if tokens <= 0:
        return 0.0, 0.0
    seen = tokens * moe.attention_dp  # the tokens the expert group sees
    local = distinct_experts(moe.experts, moe.top_k, seen) / moe.ep
    shard = moe.expert_params / moe.moe_tp
    read = local * shard * moe.bytes_per_param
    flops = 2 * seen * moe.top_k / moe.ep * shard
    fused = k.moe_tables.get(moe.table)
    if moe.table == "w4a16_mxfp4" and SPEED_ENGINES[k.backend].mxfp8_moe_activations:
        # TensorRT-LLM runs MXFP4 experts with MXFP8 activations on Blackwell (its
        # examples/models/core/gpt_oss/README.md MoE support matrix): those rows where the GPU has
        # them
        fused = k.moe_tables.get("w4a8_mxfp4_mxfp8", fused)
    if fused is not None:
        # the engine's fused MoE op as aiconfigurator measured it (tools/aic_kernels.py: its
        # fixed cost per layer, memory and compute efficiencies)
        mem = read / (k.mem_bw * min(1.0, fused["mem_efficiency"])) * 1e3
        mem += local * fused.get("per_expert_ms", 0.0)  # each expert touched: its own GEMM set-up
        comp = flops / (fused["peak_flops"] * min(1.0, fused["compute_efficiency"])) * 1e3
        gemm = moe.layers * (fused["fixed_ms"] + max(mem, comp))
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
    )


def routing_note(arch: Architecture, recipe: Recipe, levels: list[int], ep: int = 1) -> str | None:
    """The output's statement of the routing assumption and its effect at the recipe's levels."""
    moe = moe_shape(arch, recipe, recipe.build.tp_size, ep)
    if moe is None:
        return None
    bpp, _, source, _ = expert_bytes(arch, recipe, 2.0)
    shares = ", ".join(
        f"concurrency {c}: {distinct_experts(moe.experts, moe.top_k, c):.0f}"
        for c in sorted(set(levels))
    )
    return (
        f"MoE ({moe.experts} routed experts, top {moe.top_k}, {moe.layers} layers, experts at "
        f"{bpp:.3g} B/weight from {source}): a decode step reads only the experts its tokens "
        f"route to, under {ROUTING_TEXT}; distinct experts per layer read in a decode step: "
        f"{shares} of {moe.experts}. Prefill FLOPs are the active parameters', at the fused MoE "
        "op's efficiency under aiconfigurator's power-law expert load. Skewed routing reads fewer "
        "experts at small batches and loads the busiest EP rank more at large ones; "
        "multi-node wide EP and speculative decoding are not modelled."
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
