"""results.json's "prefix" record (bench.prefix's workload): the server's prefix-cache counters
over a level per KV tier, and the workload's shape; trtkv.contracts.artifacts.BenchResults holds
it."""

from __future__ import annotations

from pydantic import BaseModel


class PrefixTier(BaseModel):
    """One KV tier's prefix-cache counters over a level (the server's own, read before and after):
    prompt tokens looked up and served from the tier."""

    queries: int
    hits: int
    hit_rate: float | None = None  # hits / queries; None when nothing was looked up


class PrefixLevel(BaseModel):
    """results.json's "prefix" per level (the bench.prefix workload): the hit rates the server
    reported over the level, per tier, where they came from, and the workload's shape (requests and
    TTFT median per turn, requests per prefix group)."""

    source: str  # the metric names read, or why none were
    tiers: dict[str, PrefixTier] = {}  # "device", "host" (the reference runtime) / "connector"
    requests_per_turn: dict[int, int] = {}
    ttft_ms_p50_per_turn: dict[int, float] = {}
    requests_per_group: dict[int, int] = {}
