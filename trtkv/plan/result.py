"""What `trtkv plan` returns and `plan --json` prints, in that order: the Plan and its sections (the
model's figures, the hardware, the weights, the engine's KV pool and its terms, the attention and a
hybrid's state, one row per KV format, the example batches and the prefix-cache rows). The figures
are computed by trtkv.plan.planner from the architecture and byte counts of trtkv.plan.model.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from trtkv.core.errors import TrtkvError
from trtkv.plan.estimate_model import Estimate
from trtkv.plan.model import Architecture, ArchitectureFacts
from trtkv.platform.hardware import GPU


@dataclass(frozen=True, kw_only=True)
class PlanModel(ArchitectureFacts):
    """`plan --json`'s "model": the architecture's figures and the parameter count every weight
    figure uses."""

    # Architecture.parameters(): the recipe's count, else counted from the config, else estimated
    parameters: float

    @classmethod
    def of(cls, arch: Architecture) -> PlanModel:
        return cls(
            **{f.name: getattr(arch, f.name) for f in fields(ArchitectureFacts)},
            parameters=arch.parameters(),
        )


@dataclass(frozen=True, kw_only=True)
class PlanHardware:
    """`plan --json`'s "hardware": what the capacity is computed for."""

    gpu: GPU
    count: int
    # per GPU: hardware.memory_gib, else the GPU table's; this host's RAM on cpu
    memory_gib: float | None
    hbm_bandwidth_gbps: float | None  # None: no decode bound
    tp_size: int
    pp_size: int


@dataclass(frozen=True, kw_only=True)
class PlanTerm:
    """One figure of the engine's KV-pool rule (bytes per GPU)."""

    name: str  # weights, activation, non_torch, cuda_graphs (vLLM); context, reserve (SGLang); ...
    bytes: float
    note: str


@dataclass(frozen=True, kw_only=True)
class PlanKVPool:
    """`plan --json`'s "kv_pool": the pool the recipe's engine allocates on each GPU, the rule it
    follows (engine, release, source), the memory flags its served command carries and every term of
    the rule."""

    # the rule: vllm, vllm-cpu, sglang, trtllm (LLM API), tensorrt (engine path), reference
    engine: str
    version: str  # the engine release whose rule this is (trtkv's pinned one)
    rule: str
    source: str  # the engine's files the rule is read from
    knob: str | None  # the engine's own flag (None: the reference runtime has none)
    knob_value: float | None
    knob_is_default: bool  # the recipe left it unset: the engine's default at that release
    cap_flag: str | None  # --kv-cache-memory-bytes (pins), --max-total-tokens / max_tokens (caps)
    cap_value: int | None  # bytes (vLLM) or tokens
    # what the knob hands the rule (util x total, free before loading x fraction, ...)
    budget_bytes: float
    terms: tuple[PlanTerm, ...]
    available_bytes: float  # the rule's figure before any cap or block rounding
    pool_bytes: float  # what is allocated: the rule, the cap or the pin, in whole blocks
    bound: str  # "rule", "cap" or "pin"
    notes: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class PlanWeights:
    """`plan --json`'s "weights"."""

    # the recipe's quantization.weights, or "as stored" (a pre-quantized checkpoint priced as
    # stored)
    precision: str
    total_gib: float
    per_gpu_gib: float


@dataclass(frozen=True, kw_only=True)
class PlanAttention:
    """`plan --json`'s "attention": the layers' attention and the engine sizing the capacity
    follows."""

    layers: tuple[str, ...]  # one label per layer ("full", "sliding:4096", ...)
    summary: str
    source: str
    mla_latent_elements: int | None
    sinks: str | None
    accounting: str  # the engine's sizing (ACCOUNTING_TEXT / SGLANG_ACCOUNTING_TEXT)
    max_num_batched_tokens: int
    vllm_block_size: int
    vllm_hybrid_manager: bool
    kv_layers: int  # layers holding a KV cache of their own (not a state layer, not `none`)
    state: PlanState | None = None  # a hybrid's linear / mamba layers


@dataclass(frozen=True, kw_only=True)
class PlanState:
    """`plan --json`'s "attention.state": the fixed per-sequence state of a hybrid's linear / mamba
    layers."""

    kind: str  # trtkv.recipe.state.StateKind: gated_deltanet, mamba2, mamba1
    layers: int
    conv_dtype: str
    recurrent_dtype: str
    # why these dtypes: the recipe's build.mamba_*_cache_dtype or the engine's default
    dtype_source: str
    bytes_per_layer: float  # one sequence, one layer, all GPUs
    bytes_per_sequence: float  # one sequence, every state layer, all GPUs
    bytes_per_sequence_per_gpu: float  # on the fullest GPU (TP splits heads and conv channels)
    vllm_attention_block: int  # the attention block vLLM aligns to the state page (tokens)
    source: str  # the config fields the shape came from


@dataclass(frozen=True, kw_only=True)
class PlanExample:
    """KV memory of `batch` sequences of `context_len` tokens in each format; in JSON,
    `<format>_gib` keys."""

    context_len: int
    batch: int
    kv_gib: dict[str, float]  # format label -> GiB (all GPUs), in the order of Plan.formats

    def to_dict(self) -> dict[str, Any]:
        return {
            "context_len": self.context_len,
            "batch": self.batch,
            **{f"{k}_gib": v for k, v in self.kv_gib.items()},
        }


@dataclass(frozen=True, kw_only=True)
class PrefixRow:
    """One format's sequences per replica of the workload at each prefix hit rate (key: the rate,
    e.g. "0.5")."""

    format: str
    sequences: dict[str, int]


@dataclass(frozen=True, kw_only=True)
class PlanPrefixCache:
    """`plan --json`'s "prefix_cache": whether the served engine reuses KV blocks of shared prefixes
    (and why), and what a hit rate does to the sequences a replica holds (trtkv.plan.prefix)."""

    enabled: bool
    why: str
    # the workload: bench.input_tokens in (under bench.prefix a session's mean prompt over its
    # turns, rounded), bench.output_tokens out
    input_tokens: int
    output_tokens: int
    hit_rates: list[float]  # [0.0] where the engine reuses nothing
    rows: list[PrefixRow]


@dataclass(frozen=True, kw_only=True)
class PlanConcurrency:
    """`plan --json`'s "concurrency": the requests one replica runs at once. The engines admit
    requests while their KV blocks last, so the cap the served command passes (build.max_batch_size
    as the engine's flag) is sized for the workload (bench.input_tokens + bench.output_tokens), not
    for max_seq_len sequences only, and held under the engine's own default (trtkv.plan.concurrency
    sizes it; `trtkv init` writes it)."""

    max_seq_len: int
    full_context_sequences: int  # sequences of max_seq_len that fit (the recipe's KV format)
    input_tokens: int  # the workload: bench.input_tokens in, bench.output_tokens out
    output_tokens: int
    workload_sequences: int  # sequences of the workload that fit, as the engine accounts them
    engine_limit: int | None  # the engine's own default cap (None: no limit of its own)
    engine_limit_source: str
    flag: str  # the engine's name for the cap
    cap: int  # build.max_batch_size: what the served command passes
    sized: int  # what the workload asks: min(workload_sequences, engine_limit), at least 1


@dataclass(frozen=True, kw_only=True)
class FormatCapacity:
    """One KV format's row of the plan (the recipe's own, mixed or named, first)."""

    # a KVFormat value, or the recipe's label (fp8_attn_head, a format with kv_skip_layers)
    format: str
    bytes_per_token: float  # every layer holding the token (short contexts)
    bytes_per_token_per_gpu: float
    tokens_per_gpu_budget: int
    max_sequences: dict[int, int]
    kv_gib_at_max_batch: dict[int, float]
    # at each length, batch = min(max_batch_size, what fits); empty: no bandwidth
    decode_step_ms: dict[int, float]
    accounting: str  # which engine's sizing the capacity follows
    per_sequence_kv_bytes: dict[int, float]  # one sequence, all GPUs, this accounting
    per_sequence_kv_bytes_per_gpu: dict[int, float]
    per_sequence_kv_bytes_by_accounting: dict[str, dict[int, float]]
    tokens_fit: dict[int, int]  # max_sequences x length, per GPU
    bytes_by_attention: dict[int, dict[str, float]]  # exact, per layer type
    # the pool's tokens as the recipe's engine counts and prints them (its EngineTokens rule:
    # vLLM's hybrid allocator, SGLang's SWA pool, TensorRT-LLM's max tokens), beside the exact
    # account's every-layer token above; they differ where layers are sliding, chunked or state
    engine_bytes_per_token_per_gpu: float
    engine_tokens_per_gpu: int


@dataclass(frozen=True, kw_only=True)
class TierRow:
    """trtkv.plan.tiers: one KV format's tokens and workload sequences per replica, per tier."""

    format: str
    device_tokens: int
    host_tokens: int
    running_sequences: int  # device pool only
    resident_sequences: int  # device + host


@dataclass(frozen=True, kw_only=True)
class PlanKVTiers:
    """`plan --json`'s "kv_tiers" (only where the recipe sets a tier beyond the device)."""

    engine: str
    host_bytes_per_replica: int
    served: str  # the engine's flag or field and value
    scope: str  # its unit and scope
    numa: str
    input_tokens: int
    output_tokens: int
    rows: list[TierRow]


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What `trtkv plan` returns and `plan --json` prints (keys in this order)."""

    recipe: str
    model: PlanModel
    hardware: PlanHardware
    weights: PlanWeights
    kv_pool: PlanKVPool
    # = kv_pool.pool_bytes: the pool the token and sequence counts below divide
    kv_pool_bytes_per_gpu: float
    # the same pool in GiB (the name plan --json had before the engine rules)
    kv_budget_gib_per_gpu: float
    recipe_kv_format: str
    lengths: list[int]
    formats: list[FormatCapacity]
    examples: list[PlanExample]
    advice: list[str]
    advice_basis: str
    notes: list[str]
    attention: PlanAttention
    # trtkv.plan.prefix: what a prefix-cache hit rate does to capacity, per format
    prefix_cache: PlanPrefixCache
    # trtkv.plan.concurrency: full-context sequences, the workload's, and the cap passed
    concurrency: PlanConcurrency
    # how the recipe's engine counts a token (FormatCapacity.engine_*), with its source
    engine_token_rule: str
    # `plan --estimate` (trtkv.plan.estimate); plan --json writes Estimate.to_json() (per format:
    # levels of ttft_ms, itl_ms, output_tokens_per_s, source), and leaves the key out without
    # --estimate
    estimate: Estimate | None = None
    # trtkv.plan.tiers: capacity per tier (device, host) per format; in JSON only where the recipe
    # sets a tier beyond the device
    kv_tiers: PlanKVTiers | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            **asdict(replace(self, estimate=None)),
            "examples": [e.to_dict() for e in self.examples],
        }
        del out["estimate"]
        if self.kv_tiers is None:
            del out["kv_tiers"]
        if self.estimate is not None:
            out["estimate"] = self.estimate.to_json()
        return out

    def to_json(self) -> str:
        """plan --json: strict JSON (allow_nan=False), so a non-finite figure is an error, never
        `NaN` or `Infinity` in the output."""
        try:
            return json.dumps(self.to_dict(), indent=2, allow_nan=False)
        except ValueError as exc:
            raise TrtkvError(
                f"plan --json for {self.recipe}: a figure is not finite ({exc}). Next: report this "
                "with the recipe; `trtkv plan` without --json shows the figures."
            ) from None
