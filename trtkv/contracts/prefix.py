"""results.json's "prefix" record (bench.prefix's workload): the server's prefix-cache counters
over a level per KV tier, and the workload's shape; trtkv.contracts.bench_doc.BenchResults holds
it. Beside them, the plan's predicted hit rates per tier (PrefixPrediction, handed to bench in
trtkv.contracts.PlanFigures.prefix), so a level reads measured against predicted."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class PrefixTier(BaseModel):
    """One KV tier's prefix-cache counters over a level (the server's own, read before and after):
    prompt tokens looked up and served from the tier."""

    queries: int
    hits: int
    hit_rate: float | None = None  # hits / queries; None when nothing was looked up


class PredictedHits(BaseModel):
    """The plan's hit rates per tier at one concurrency level (of every prompt token a session
    sends), and what they rest on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: float
    host: float
    routing: str  # the routing assumption (one engine, or prefix-aware across attention-DP engines)
    basis: str  # the pools, the eviction and the occupancy the rates were derived with


class PrefixPrediction(BaseModel):
    """What `trtkv plan` predicts for bench.prefix's workload on the recipe's own KV format
    (trtkv.plan.prefix_reuse's hit-rate model), per concurrency level."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kv_format: str
    block_tokens: int
    device_tokens: int  # per engine, in the format's bytes
    host_tokens: int
    levels: dict[int, PredictedHits]  # by concurrency


class PrefixLevel(BaseModel):
    """results.json's "prefix" per level (the bench.prefix workload): the hit rates the server
    reported over the level, per tier, where they came from, and the workload's shape (requests and
    TTFT median per turn, requests per prefix group); `predicted`: the plan's rates for the level
    (None: no plan figures were handed to bench)."""

    source: str  # the metric names read, or why none were
    tiers: dict[str, PrefixTier] = {}  # "device", "host" (the reference runtime) / "connector"
    requests_per_turn: dict[int, int] = {}
    ttft_ms_p50_per_turn: dict[int, float] = {}
    requests_per_group: dict[int, int] = {}
    predicted: PredictedHits | None = None

    def against_plan(self) -> list[tuple[str, float | None, float | None]]:
        """Per tier, (tier, the server's hit rate, the plan's): the device tier, then the second
        tier (the reference runtime's "host", vLLM's connector "connector": the plan's host
        tier); a tier neither side has is left out."""
        plan = self.predicted
        second = "connector" if "connector" in self.tiers else "host"
        shown = ["device"]
        if second in self.tiers or (plan is not None and plan.host > 0):
            shown.append(second)
        out: list[tuple[str, float | None, float | None]] = []
        for tier in shown:
            got = self.tiers.get(tier)
            want = None if plan is None else (plan.device if tier == "device" else plan.host)
            if got is not None or want is not None:
                out.append((tier, None if got is None else got.hit_rate, want))
        return out

    def against_plan_text(self) -> str:
        """One line: each tier's hit rate, the server's against the plan's and the difference,
        then the plan's routing assumption (or that no plan figures were handed in)."""
        parts = []
        for tier, got, want in self.against_plan():
            measured = "-" if got is None else f"{got:.3f}"
            if want is None:
                parts.append(f"{tier} {measured}")
            elif got is None:
                parts.append(f"{tier} - (plan {want:.3f})")
            else:
                parts.append(f"{tier} {measured} (plan {want:.3f}, {got - want:+.3f})")
        tail = (
            f"routing: {self.predicted.routing}"
            if self.predicted is not None
            else "no plan prediction"
        )
        return ", ".join(parts) + f"; {tail}"


def with_prediction(
    prefix: dict[str, PrefixLevel], plan: PrefixPrediction | None
) -> dict[str, PrefixLevel]:
    """Each level ("concurrency=N") with the plan's hit rates at N beside the server's."""
    if plan is None:
        return prefix
    out = {}
    for label, level in prefix.items():
        conc = int(label.split("=", 1)[1]) if label.startswith("concurrency=") else None
        hits = plan.levels.get(conc) if conc is not None else None
        out[label] = level.model_copy(update={"predicted": hits}) if hits else level
    return out
