"""The latency levels of bench.prefix's workload: per concurrency level a warm-up of plain prompts,
the server's prefix-cache counters read, the sessions run (trtkv.bench.load.sessions), the counters
read again; the level's hit rates per tier and its shape (per turn, per group) go to results.json's
"prefix". One client process (the sessions' turns depend on the answers, so the level is not
sharded over worker processes); the open loop (bench.request_rate) is not offered for it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from trtkv.bench.load.loadgen import Interrupted, Job, SessionPool, run_concurrency
from trtkv.bench.load.prefix_counters import level_prefix, read_counters
from trtkv.bench.load.prompts import latency_prompts, prompt_tokens
from trtkv.bench.load.sessions import group_summary, plan_workload, run_sessions
from trtkv.bench.transport.client import Endpoint, SamplingParams
from trtkv.bench.transport.endpoints import session_factory
from trtkv.contracts.bench_doc import RequestRecord
from trtkv.recipe import Protocol, Recipe


def metrics_url(recipe: Recipe, ep: Endpoint) -> str:
    """Where the server's /metrics is: the OpenAI server's own port, else Triton's metrics port
    on the endpoint's host."""
    host = urlsplit(f"//{ep.url}").hostname or "127.0.0.1"
    if ep.protocol is Protocol.OPENAI:
        return f"http://{ep.url}/metrics"
    return f"http://{host}:{recipe.triton.metrics_port}/metrics"


def run_prefix_levels(
    recipe: Recipe,
    ep: Endpoint,
    tokenizer: Any,
    phase: Callable[[str, int], Callable[[RequestRecord], None]],
    records: list[RequestRecord],
    by_level: dict[str, list[RequestRecord]],
    prefix: dict[str, Any],
) -> None:
    b = recipe.bench
    work = plan_workload(tokenizer, b, -(-b.num_requests // b.prefix.turns))
    warm_prompts = latency_prompts(tokenizer, max(1, b.warmup_requests), b.input_tokens)
    url = metrics_url(recipe, ep)
    for conc in b.concurrency:
        label = f"concurrency={conc}"
        pool = SessionPool(session_factory(ep), conc)
        try:
            if b.warmup_requests:
                warm = [
                    Job(
                        RequestRecord(
                            f"{label}-warmup-{k}",
                            "warmup",
                            label,
                            k,
                            prompt_tokens(tokenizer, warm_prompts[k % len(warm_prompts)]),
                            b.warmup_output_tokens or b.output_tokens,
                        ),
                        warm_prompts[k % len(warm_prompts)],
                        SamplingParams(max_tokens=b.warmup_output_tokens or b.output_tokens),
                    )
                    for k in range(max(b.warmup_requests, conc))
                ]
                try:
                    got = run_concurrency(
                        pool, warm, conc, b.request_timeout_s, phase(f"warmup {label}", len(warm))
                    )
                except Interrupted as stop:
                    records.extend(stop.records)
                    raise
                records.extend(got)
            before, source = read_counters(url)
            done = phase(f"prefix sessions {label}", b.num_requests)
            try:
                recs = run_sessions(
                    pool, work, tokenizer, label, conc, b.num_requests, b.request_timeout_s, done
                )
            except Interrupted as stop:
                records.extend(stop.records)
                by_level[label] = stop.records
                raise
            after, source = read_counters(url)
            records.extend(recs)
            by_level[label] = recs
            prefix[label] = level_prefix(before, after, source, group_summary(recs))
        finally:
            pool.close()
