"""trtkv's own speed model: one engine step as per-layer GEMM, attention and communication time,
then TTFT and ITL of a steady in-flight batch with chunked prefill; for every KV format, GPU and
engine, including those aiconfigurator has no data for (INT8, NVFP4, INT4 groups, per-token-head,
GPUs outside its tables).

Where each number comes from:
- Datasheet figures (HBM bandwidth, dense tensor-core FLOPs, NVLink/PCIe bandwidth): the GPU's YAML
  in aiconfigurator-core 0.12.0 (`systems/<gpu>.yaml`), copied into
  trtkv/data/speed_efficiencies.json with the rest.
- Kernel efficiencies (achieved / datasheet) per GPU, engine and kernel: read from
  aiconfigurator-core 0.12.0's measured kernel tables at ONE reference shape each (a 70B-class layer
  at TP4; `tools/aic_kernels.py` names the shape and the table, `make speed-efficiencies` rewrites
  the JSON). An efficiency above 1 (a table row faster than the datasheet allows) is capped at 1. A
  GPU without tables (AIC_SYSTEM) borrows the efficiencies of the GPU with tables of its compute
  capability, else of its architecture (ARCH_REFERENCE), at its own bandwidth (GPU_SPECS); its
  tensor-core peaks are its own where aiconfigurator ships its datasheet (DATASHEET_SYSTEM), else
  the lender's scaled by the bandwidth ratio, which `Kernels.peaks` says (then TTFT, compute-bound,
  is the least certain figure).
- Dequantization: counted operations per K/V element read (each format's registry row,
  storage.dequant_ops) on the CUDA cores (FP32_TFLOPS, datasheet); FP8's cost is inside its
  measured kernel efficiency.
Assumptions said where they are made: decode attention reads each sequence's K/V once per layer per
step; prefill attention is causal over the prefix the layer keeps (its window); MoE experts are
priced by the experts a step routes to (trtkv.plan.moe_step); pipeline stages add their times
(latency, not pipelined throughput); two all-reduces per layer under TP. A hybrid's state layers
(Mamba, Gated DeltaNet) run no attention: their fixed state is read once per decode step with the KV
(the sequence's bytes include it), their scan's compute is not priced; a KV-shared layer (Gemma 4)
reads no cache of its own here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from trtkv.core.errors import TrtkvError
from trtkv.kvcache.formats import SPECS, UNQUANTIZED, KVFormat
from trtkv.plan.allreduce import allreduce_ms, by_gpus
from trtkv.plan.in_flight import in_flight_ms
from trtkv.plan.moe_step import MoEShape, routed_ms
from trtkv.plan.moe_tables import Rows, moe_kernels
from trtkv.platform.hardware import GPU, GPU_SPECS
from trtkv.recipe.backend_rules import SPEED_ENGINES

DATA = Path(__file__).resolve().parents[1] / "data" / "speed_efficiencies.json"
# trtkv GPU -> the aiconfigurator-core 0.12.0 system whose measured kernel tables
# (systems/data/<system>/) were taken on that GPU: every system with tables that GPU_SPECS has a GPU
# for (gb300: no trtkv GPU; b60: not an NVIDIA GPU). Its h100_pcie, l4, a100_pcie and a30 are
# datasheet-only YAMLs ("No built-in silicon performance database"): no tables.
AIC_SYSTEM = {
    GPU.A100_80GB: "a100_sxm",
    GPU.H100_80GB: "h100_sxm",
    GPU.H200_141GB: "h200_sxm",
    GPU.L40S: "l40s",
    GPU.B200: "b200_sxm",
    GPU.B300: "b300_sxm",
    GPU.GB200: "gb200",
    GPU.RTX_PRO_6000: "rtx_pro_6000_server",
}
# GPUs whose datasheet figures aiconfigurator ships without tables (speed_efficiencies.json's
# "datasheets")
DATASHEET_SYSTEM = {GPU.H100_PCIE: "h100_pcie", GPU.L4: "l4"}
# Dense tensor-core and FP32 TFLOPS (bfloat16, fp8, fp32) of GPUs without tables whose peaks no
# aiconfigurator YAML ships, where NVIDIA publishes them: H20 148 FP16/BF16, 296 FP8/INT8, 44 FP32
# (its product brief, as tabled e.g. on willitrunai.com/gpus/h20-96gb: "148 TFLOPS FP16 ... 296
# INT8"). The bandwidth-ratio fallback would give it H100's 989 x 4.0/3.35 BF16 TFLOPS, 8x too
# many: H20 keeps H100's bandwidth class but 78 of its 132 SMs at capped tensor throughput.
OWN_PEAKS_TFLOPS = {GPU.H20: (148.0, 296.0, 44.0)}
ARCH_REFERENCE = {
    "Hopper": "h100_sxm",
    "Blackwell": "b200_sxm",
    "Ampere": "a100_sxm",
    "Ada": "l40s",
}
# FP32 CUDA-core TFLOPS, which aiconfigurator's system YAMLs do not carry (NVIDIA datasheets: A100
# SXM 19.5, H100 SXM 67, H100 PCIe 51, H200 67, L40S 91.6, L4 30.3; HGX B200 and HGX B300 600 / 8 =
# 75; GB200 90 per GPU at 1,200 W, the configuration aiconfigurator's gb200.yaml rates at 2,500 BF16
# TFLOPS (NVIDIA's figures as tabled on glennklockwood.com/garden/processors/B200); RTX PRO 6000
# Blackwell Server: 24,064 CUDA cores x 2 x 2.43 GHz, the SM clock aiconfigurator's
# rtx_pro_6000_server.yaml scales its tensor-core figures to)
FP32_TFLOPS = {
    "a100_sxm": 19.5,
    "h100_sxm": 67.0,
    "h100_pcie": 51.0,
    "h200_sxm": 67.0,
    "l40s": 91.6,
    "l4": 30.3,
    "b200_sxm": 75.0,
    "b300_sxm": 75.0,
    "gb200": 90.0,
    "rtx_pro_6000_server": 24064 * 2 * 2.43e-3,
}
# Elementwise passes over a hidden-sized activation per layer and token (2 RMSNorms x read+write, 2
# residual adds x 3, RoPE on Q and K ~1.25 hidden x 2, SiLU-and-mul over the MLP width: counted with
# intermediate/hidden below), and the kernels they take per layer (input RMSNorm, RoPE, KV-cache
# write, post-attention RMSNorm with its residual add, SiLU-and-mul), each priced as aiconfigurator
# prices a memory-bound op: bytes at mem_bw x mem_bw_empirical_scaling_factor plus
# mem_empirical_constant_latency (systems/<gpu>.yaml: 0.8 and 3 us on every GPU).
ELEMENTWISE_PASSES = 2 * 2 + 2 * 3 + 2.5
ELEMENTWISE_KERNELS = 5
GEMMS_PER_LAYER = 4  # fused QKV, attention output, fused gate/up, down


def queue_factor(prefill_steps: int) -> float:
    """aiconfigurator-core 0.12.0's TTFT factor over one request's prefill time."""
    return min(2 + (prefill_steps - 3) / 2 / 10, 4.0)


@dataclass(frozen=True)
class Kernels:
    """Efficiencies and datasheet figures for one GPU and one engine (the speed model's whole
    calibration)."""

    system: str  # the aiconfigurator system the efficiencies come from
    backend: str
    versions: str  # "vllm 0.24.0"
    mem_bw: float  # B/s of this GPU
    flops: dict[str, float]  # dense tensor-core FLOP/s by dtype (bfloat16, fp8)
    fp32_flops: float
    link_bw: float  # B/s, one direction, per GPU
    eff: dict[str, float]  # "gemm_memory.bfloat16" -> efficiency, ...
    gemm_fixed_ms: dict[str, float]  # "gemm_memory.bfloat16" -> fixed cost per GEMM call, ...
    attn_floor_ms: dict[str, float]  # decode attention's fixed cost per call, by KV dtype
    ar_floor_ms: float
    ar_bus_eff: float
    borrowed: bool  # efficiencies from another GPU's tables (reference_system)
    op_bw_scale: float = 0.8  # aiconfigurator's memory-op model (systems/<gpu>.yaml)
    op_latency_ms: float = 0.003
    peaks: str = ""  # a borrowed GPU: where its tensor-core and FP32 peaks come from
    # the fused MoE op per expert dtype (moe_perf.parquet fits: trtkv.plan.moe_step.routed_ms)
    moe_tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    ar_by_gpus: dict[int, tuple[float, float]] = field(default_factory=dict)  # plan.allreduce
    # the fused MoE op's own rows per shape, a prefill's and a decode step's (trtkv.plan.moe_tables)
    moe_rows: Rows = field(default_factory=dict)
    moe_row_tokens: tuple[int, ...] = ()
    moe_decode_rows: Rows = field(default_factory=dict)
    moe_decode_tokens: tuple[int, ...] = ()

    def efficiency(self, kind: str, dtype: str) -> float:
        got = self.eff.get(f"{kind}.{dtype}") or self.eff.get(f"{kind}.bfloat16")
        if got is None:
            raise TrtkvError(
                f"{DATA}: no {kind} efficiency for {self.system} {self.backend}. Next: "
                f"`make speed-efficiencies` (aiconfigurator's tables)."
            )
        return min(1.0, got)

    @property
    def source(self) -> str:
        how = f"{self.system} {self.versions} kernel tables" + (
            ", borrowed" if self.borrowed else ""
        )
        return (
            "trtkv model (efficiencies: aiconfigurator-core "
            f"{load_data()['aiconfigurator_core']} {how})"
        )


@lru_cache(maxsize=1)
def load_data(path: Path = DATA) -> dict[str, Any]:
    return json.loads(path.read_text())


def reference_system(gpu: GPU) -> str:
    """The system whose tables a GPU without its own borrows: the first of AIC_SYSTEM with its
    compute capability (the same kernels run there), else its architecture's reference
    (ARCH_REFERENCE)."""
    spec = GPU_SPECS[gpu]
    same = [system for g, system in AIC_SYSTEM.items() if GPU_SPECS[g].sm == spec.sm]
    return same[0] if same else ARCH_REFERENCE.get(spec.arch, "h100_sxm")


def kernels_for(gpu: GPU, engine: str) -> Kernels:
    """The model's calibration for this GPU and engine, by aiconfigurator's name for it ("trtllm",
    "vllm", "sglang": recipe.backend_rules.SPEED_ENGINE)."""
    spec = GPU_SPECS.get(gpu)
    if spec is None:
        raise TrtkvError(
            f"hardware.gpu {gpu.value}: the speed model needs a GPU; allowed: "
            f"{', '.join(g.value for g in GPU_SPECS)}. Next: measure on this machine with "
            f"`trtkv bench --sweep-input`."
        )
    data = load_data()
    system = AIC_SYSTEM.get(gpu)
    borrowed = system is None
    if system is None:
        system = reference_system(gpu)
    entry = data["systems"][system]
    tables = entry["backends"].get(engine) or next(iter(entry["backends"].values()))
    g, peaks = entry["gpu"], ""
    flops = {
        "bfloat16": float(g["bfloat16_tc_flops"]),
        "fp8": float(g.get("fp8_tc_flops") or g["bfloat16_tc_flops"]),
    }
    fp32, link = FP32_TFLOPS[system] * 1e12, float(entry["intra_node_bw"])
    sheet = data.get("datasheets", {}).get(DATASHEET_SYSTEM.get(gpu, ""))
    if borrowed and sheet is not None:  # its own datasheet, as aiconfigurator ships it
        own = sheet["gpu"]
        flops = {
            "bfloat16": float(own["bfloat16_tc_flops"]),
            "fp8": float(own.get("fp8_tc_flops") or own["bfloat16_tc_flops"]),
        }
        fp32, link = FP32_TFLOPS[DATASHEET_SYSTEM[gpu]] * 1e12, float(sheet["intra_node_bw"])
        peaks = (
            f"{gpu.value}'s own peaks (aiconfigurator-core's {DATASHEET_SYSTEM[gpu]}.yaml "
            "datasheet)"
        )
    elif borrowed and gpu in OWN_PEAKS_TFLOPS:  # NVIDIA's published peaks (OWN_PEAKS_TFLOPS)
        bf16, fp8, fp32_tflops = OWN_PEAKS_TFLOPS[gpu]
        flops, fp32 = {"bfloat16": bf16 * 1e12, "fp8": fp8 * 1e12}, fp32_tflops * 1e12
        peaks = (
            f"{gpu.value}'s own peaks (NVIDIA's datasheet figures: {bf16:g} BF16, {fp8:g} FP8, "
            f"{fp32_tflops:g} FP32 dense TFLOPS)"
        )
    # no peak figures for this GPU anywhere trtkv reads: the lender's, in its ratio to bandwidth
    elif borrowed:
        scale = spec.hbm_bandwidth_gbps * 1e9 / float(g["mem_bw"])
        flops = {k: v * scale for k, v in flops.items()}
        fp32 *= scale
        peaks = (
            f"no tensor-core peak for {gpu.value} in any table trtkv reads: {system}'s scaled by "
            f"the bandwidth ratio ({spec.hbm_bandwidth_gbps:g} / {float(g['mem_bw']) / 1e9:g} "
            "GB/s), so its TTFT is the least certain figure"
        )
    ar = entry.get("allreduce", {"floor_ms": 0.01, "bus_efficiency": 0.5})
    eff = {
        k: v["efficiency"] for k, v in tables.items() if isinstance(v, dict) and "efficiency" in v
    }
    floors = {
        k.split(".", 1)[1]: v["floor_ms"]
        for k, v in tables.items()
        if isinstance(v, dict) and "floor_ms" in v
    }
    fixed = {
        k: v["fixed_ms"]
        for k, v in tables.items()
        if isinstance(v, dict) and "fixed_ms" in v and not k.startswith("moe.")
    }
    moe = {k.split(".", 1)[1]: v for k, v in tables.items() if k.startswith("moe.")}
    fused = moe_kernels(f"{system}/{engine}", moe, flops, g if borrowed else None)
    return Kernels(
        system,
        engine,
        f"{engine} {tables['attention_version']}",
        spec.hbm_bandwidth_gbps * 1e9,
        flops,
        fp32,
        link,
        eff,
        fixed,
        floors,
        float(ar["floor_ms"]),
        min(1.0, float(ar["bus_efficiency"])),
        borrowed,
        float(g.get("mem_bw_empirical_scaling_factor") or 0.8),
        float(g.get("mem_empirical_constant_latency") or 3e-6) * 1e3,
        peaks,
        fused[0],
        by_gpus(tables),
        *fused[1:],
    )


@dataclass(frozen=True)
class ModelShape:
    """What one step of the model costs, per GPU (after TP), independent of the KV format."""

    num_layers: int
    hidden: int
    intermediate: int
    q_heads: int  # per GPU
    head_dim: int
    gemm_params: float  # per GPU: every linear layer and the LM head
    weight_bytes: float  # per GPU: what one step reads of those
    weight_dtype: str  # "bfloat16" or "fp8": the GEMM kernels' lane
    # per attention layer (state and no-cache layers run none): its window (None: full)
    windows: tuple[int | None, ...]
    tp: int
    pp: int
    # routed experts (gemm_params and weight_bytes then hold the rest: trtkv.plan.moe_step)
    moe: MoEShape | None = None
    # GEMM calls and elementwise kernels per layer, by its structure (trtkv.plan.layer_ops)
    gemm_calls: float = GEMMS_PER_LAYER
    layer_kernels: float = ELEMENTWISE_KERNELS


@dataclass(frozen=True)
class KVCost:
    """One KV format's cost: bytes a sequence of n tokens holds per GPU (a callable) and its kernel
    lane."""

    fmt: KVFormat
    # Callable[[int], float]: bytes per GPU of one sequence at context n, every layer
    seq_bytes: Any
    lane: str  # "bfloat16" or "fp8": the measured attention kernel the format runs closest to
    dequant_ops: int
    # K/V elements per token and layer per GPU (the dequant ALU work)
    elements_per_token_layer: float


def kv_lane(fmt: KVFormat) -> tuple[str, int]:
    """The measured attention kernel a format runs closest to, and its dequantization operations
    per K/V element read (the registry row's storage.dequant_ops, counted from the format: static
    INT8: convert + scale; per-token-head: convert + its token's scale; INT4 groups/KIVI: unpack
    (shift, mask), convert, scale and zero point; NVFP4: E2M1 decode, block scale, global scale;
    TurboQuant/UltraQuant: codebook lookup or E2M1 decode, scale/norm, zero point, rotation share;
    FP8 and 16-bit: 0, FP8's cost is in its kernel table)."""
    return ("bfloat16" if fmt in UNQUANTIZED else "fp8"), SPECS[fmt].dequant_ops


@dataclass(frozen=True)
class Step:
    """Times of one engine step, in ms, and its parts."""

    gemm_ms: float
    attention_ms: float
    comm_ms: float
    other_ms: float

    @property
    def total_ms(self) -> float:
        return self.gemm_ms + self.attention_ms + self.comm_ms + self.other_ms


def step_time(
    k: Kernels,
    m: ModelShape,
    kv: KVCost,
    decode_contexts: list[float],
    chunk: int = 0,
    chunk_prefix: int = 0,
    pieces: tuple[tuple[int, int], ...] = (),
) -> Step:
    """One engine step: `decode_contexts` sequences decode one token each at those context lengths,
    and one prefill chunk of `chunk` tokens whose request already holds `chunk_prefix` tokens
    (chunked prefill mixes them), or several requests' prefill `pieces` (tokens, prefix) packed
    into the step's token budget (trtkv.plan.waves)."""
    pieces = pieces or ((chunk, chunk_prefix),)
    chunk = sum(n for n, _ in pieces)
    tokens = len(decode_contexts) + chunk
    if tokens == 0:
        return Step(0.0, 0.0, 0.0, 0.0)
    # GEMMs, per layer as a roofline: the weights once, or the FLOPs of every token, whichever is
    # slower, plus each GEMM call's fixed cost (GEMMS_PER_LAYER per layer and the LM head)
    calls = m.gemm_calls * m.num_layers + 1
    w_ms = m.weight_bytes / (k.mem_bw * k.efficiency("gemm_memory", m.weight_dtype)) * 1e3
    w_ms += calls * k.gemm_fixed_ms.get(f"gemm_memory.{m.weight_dtype}", 0.0)
    f_ms = (
        2
        * tokens
        * m.gemm_params
        / (k.flops[m.weight_dtype] * k.efficiency("gemm_compute", m.weight_dtype))
        * 1e3
    )
    f_ms += calls * k.gemm_fixed_ms.get(f"gemm_compute.{m.weight_dtype}", 0.0)
    gemm = max(w_ms, f_ms)
    comm = 0.0
    if m.moe is not None:
        expert_ms, comm = routed_ms(k, m.moe, tokens)
        gemm += expert_ms
    # decode attention: every sequence's K/V once per layer, at the lane's measured efficiency, or
    # the dequant ALU
    attn = 0.0
    if decode_contexts:
        kv_bytes = sum(kv.seq_bytes(max(1, round(n))) for n in decode_contexts)
        mem_ms = kv_bytes / (k.mem_bw * k.efficiency("attn_decode", kv.lane)) * 1e3
        held = sum(min(n, w) if w else n for n in decode_contexts for w in m.windows)
        elements = held * kv.elements_per_token_layer
        alu_ms = elements * kv.dequant_ops / k.fp32_flops * 1e3
        floor = k.attn_floor_ms.get(kv.lane, k.attn_floor_ms.get("bfloat16", 0.01))
        attn += max(mem_ms, alu_ms) + len(m.windows) * floor
    if chunk:
        flops = 0.0
        # causal: each new token attends to the prefix the layer keeps and half its chunk
        for w in m.windows:
            for n, prefix in pieces:
                seen = min(prefix, w) if w else prefix
                span = min(n, w) if w else n
                flops += 4 * m.q_heads * m.head_dim * n * (seen + span / 2)
        lane = "fp8" if kv.lane == "fp8" and not kv.dequant_ops else "bfloat16"
        attn += flops / (k.flops["bfloat16"] * k.efficiency("attn_prefill", lane)) * 1e3
    # two all-reduces of the hidden state per layer under TP (attention out, MLP out)
    comm += 2 * m.num_layers * allreduce_ms(k, m.tp, tokens * m.hidden * 2)
    if m.pp > 1:
        comm += (m.pp - 1) * k.ar_floor_ms  # one activation hand-off per stage boundary
    passes = ELEMENTWISE_PASSES + 3 * m.intermediate / max(1, m.hidden) / m.tp
    other = (
        tokens * m.hidden * 2 * passes * m.num_layers / (k.mem_bw * k.op_bw_scale) * 1e3
        + m.layer_kernels * m.num_layers * k.op_latency_ms
    )
    return Step(gemm, attn, comm, other)


@dataclass(frozen=True)
class Serving:
    """Steady-state figures of `concurrency` requests in flight, each `isl` tokens in and `osl`
    out."""

    ttft_ms: float
    itl_ms: float  # mean time between tokens (TPOT), prefill chunks of other requests included
    # a step without a prefill chunk: what the median ITL measures while those are rare
    itl_p50_ms: float
    output_tokens_per_s_per_gpu: float
    output_tokens_per_s_per_user: float
    decode_step: Step


def serve(
    k: Kernels, m: ModelShape, kv: KVCost, isl: int, osl: int, concurrency: int, budget_tokens: int
) -> Serving:
    """In-flight batching with chunked prefill, in steady state: every request is prefilled in
    chunks of at most `budget_tokens` minus the decodes sharing the step, then decodes osl - 1
    steps; the C requests' prefills are spread over the cycle in which each of them finishes once.
    One prefill runs at a time (vLLM's max_num_partial_prefills 1, TensorRT-LLM's and SGLang's
    chunked prefill alike), so a request waits for the one ahead: an M/D/1 queue whose load is the
    share of the cycle spent prefilling (mean wait rho / (2 (1 - rho)) x one prefill)."""
    c = max(1, concurrency)
    others = c - 1
    chunk_cap = max(1, budget_tokens - others)
    n_chunks = math.ceil(isl / chunk_cap)
    chunk = math.ceil(isl / n_chunks)
    mean_ctx = isl + osl / 2
    decoders = [mean_ctx] * others
    prefill_ms = sum(
        step_time(k, m, kv, decoders, chunk, i * chunk).total_ms for i in range(n_chunks)
    )
    dec = step_time(k, m, kv, [mean_ctx] * c)
    mixed_mean = prefill_ms / n_chunks
    decode_steps = max(0, osl - 1)
    # a cycle: every slot prefills once and decodes osl - 1 tokens
    steps = max(decode_steps + n_chunks, c * n_chunks)
    pure = max(0, steps - c * n_chunks)
    cycle_ms = c * n_chunks * mixed_mean + pure * dec.total_ms
    rho = min(0.95, c * prefill_ms / cycle_ms) if c > 1 else 0.0
    queue = 1 + rho / (2 * (1 - rho))
    engine = SPEED_ENGINES[k.backend]
    if engine.queued:
        queue = max(queue, queue_factor(math.ceil(isl * c / chunk_cap)))
    wait = in_flight_ms(k.backend, dec.total_ms, c if decode_steps else 1)  # plan.in_flight
    ttft = prefill_ms * queue + m.num_layers * engine.dispatch_ms_per_layer + wait
    itl = (cycle_ms - prefill_ms) / decode_steps if decode_steps else 0.0
    gpus = m.tp * m.pp
    tps_gpu = c * osl / (cycle_ms / 1e3) / gpus
    return Serving(ttft, itl, dec.total_ms, tps_gpu, 1e3 / itl if itl else 0.0, dec)
