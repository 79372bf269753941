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
        }
