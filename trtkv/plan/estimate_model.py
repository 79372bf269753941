"""What `trtkv plan --estimate` returns (trtkv.plan.estimate makes it): the rows per KV format and
concurrency level and what they rest on; a leaf module, so the Plan that carries it
(trtkv.plan.result) imports no estimator."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class AicFigures:
    """aiconfigurator's figures for a row whose comparison is trtkv's model (shown beside, not
    compared: one source per concurrency level)."""

    ttft_ms: float
    itl_ms: float
    output_tokens_per_s: float  # per GPU
    output_tokens_per_s_per_user: float
    source: str


@dataclass
class EstimateRow:
    format: str
    concurrency: int
    ttft_ms: float
    itl_ms: float
    itl_p50_ms: float | None
    output_tokens_per_s: float  # per GPU
    output_tokens_per_s_per_user: float
    source: str
    fits: bool  # concurrency <= what the KV pool holds at isl + osl
    # aiconfigurator's own figures where it answered but the level's rows are trtkv's model
    aiconfigurator: AicFigures | None = None


@dataclass
class PrefixReuseRow:
    """One KV format at one concurrency level of the prefix-sharing workload
    (trtkv.plan.prefix_reuse): the pools, the hit rate per tier (of every prompt token a session
    sends) and the mean TTFT over a session's turns, without and with reuse (both trtkv's model)."""

    format: str
    concurrency: int
    device_tokens: int  # per engine
    host_tokens: int
    working_set_tokens: int  # groups x shared + the sessions' histories
    device_hit_rate: float
    host_hit_rate: float
    ttft_ms_without_reuse: float
    ttft_ms: float
    source: str


@dataclass
class PrefixReuse:
    """The workload (bench.prefix), what the hit rates rest on, and the rows."""

    shared_tokens: int
    groups: int
    turns: int
    turn_tokens: int
    think_time_s: float
    block_tokens: int
    prefix_cache: str  # on or off, and why
    eviction: str  # the engine's device and host tiers under LRU
    routing: str
    host_link: str
    rows: list[PrefixReuseRow]


@dataclass
class Estimate:
    """The rows and what they rest on; the KV pool they fit concurrency in is the plan's
    (Plan.kv_pool_bytes_per_gpu, not repeated here)."""

    workload: dict[str, Any]
    engine: str
    gpu: str
    max_concurrency: dict[str, int]  # per format: sequences of isl + osl tokens the pool holds
    rows: list[EstimateRow]
    aiconfigurator: str  # what was used, or why not (a fallback stated once, with its reason)
    notes: list[str] = field(default_factory=list)
    # the recipe's format against 16-bit at each level, from the rows (one source each)
    advice: list[str] = field(default_factory=list)
    # how the plan's model-only speed advice line starts (`plan --estimate` puts `advice` there)
    replaces_advice: str | None = None
    # a prefix-sharing workload's hit rates per tier and TTFT (bench.prefix; None without one)
    prefix: PrefixReuse | None = None

    def to_json(self) -> dict[str, Any]:
        """plan --json's `estimate`: per format, one entry per concurrency level."""
        formats: dict[str, Any] = {}
        for r in self.rows:
            entry = formats.setdefault(
                r.format, {"max_concurrency": self.max_concurrency[r.format], "levels": []}
            )
            entry["levels"].append({k: v for k, v in asdict(r).items() if k != "format"})
        return {
            "workload": self.workload,
            "engine": self.engine,
            "gpu": self.gpu,
            "aiconfigurator": self.aiconfigurator,
            "formats": formats,
            "notes": self.notes,
            "advice": self.advice,
            **({"prefix_reuse": asdict(self.prefix)} if self.prefix is not None else {}),
        }
