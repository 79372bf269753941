"""What the stages after `trtkv plan` take from it, typed: the KV pool the recipe's engine
allocates (the served pool is compared with it), what one replica holds (deploy sizes with it) and
the report's planner figures. `trtkv.plan.figures` fills it from the plan; the CLI plans and hands
it to serving, bench, deploy and report, so no stage imports the planner."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from trtkv.contracts.prefix import PrefixPrediction


class PlannedFormat(BaseModel):
    """One KV format's row of the plan, at the recipe's build.max_seq_len."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bytes_per_token: float  # every layer holding the token
    bytes_per_token_per_gpu: float
    tokens_per_gpu: int  # what the KV pool holds
    sequences_at_max_seq_len: int | None  # None: the plan has no row at that length
    decode_step_ms: float  # the decode-step lower bound at max_seq_len (0: no bandwidth)


class PlanFigures(BaseModel):
    """The plan of one recipe, as far as the later stages read it (trtkv.plan.result.Plan has the
    rest)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    recipe: str
    engine: str  # whose pool rule (vllm, sglang, trtllm, tensorrt, reference, ...)
    engine_version: str  # the engine release whose rule it is
    kv_pool_bytes_per_gpu: float
    gpu: str
    memory_gib: float | None  # per GPU (this host's RAM on cpu)
    recipe_kv_format: str  # the recipe's own row: its format, or its mixed label (kv_skip_layers)
    kv_format: str  # the recipe's KV format itself
    formats: dict[str, PlannedFormat]  # by format name or label; both above are keys
    max_seq_len: int
    weights_gib_total: float
    weights_gib_per_gpu: float
    batch_flag: str  # the engine's name for the concurrency cap (build.max_batch_size)
    bench_input_tokens: int
    bench_output_tokens: int
    bench_sequences: int  # sequences of the bench workload that fit, as the engine accounts them
    # bench.prefix's hit rates per tier as the plan predicts them (None: no prefix workload, or
    # the engine keeps no prefix cache)
    prefix: PrefixPrediction | None = None

    @property
    def pool_gib_per_gpu(self) -> float:
        return self.kv_pool_bytes_per_gpu / 2**30

    @property
    def rule(self) -> str:
        """`vllm 0.11.0`: the engine and release whose pool rule the plan follows."""
        return f"{self.engine} {self.engine_version}"
