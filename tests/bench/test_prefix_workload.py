"""bench.prefix's workload (trtkv.bench.load.sessions) and the server counters read around it
(trtkv.bench.load.prefix_counters): first prompts of exactly input_tokens whose first shared_tokens token ids are equal
within a prefix group and differ between groups; later turns send the history with the answer received; a level sends
num_requests requests over its slots; vLLM's and the reference runtime's /metrics counters become per-tier deltas."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from trtkv.bench.load.loadgen import SessionPool
from trtkv.bench.load.prefix_counters import level_prefix, parse_counters
from trtkv.bench.load.prompts import load_tokenizer
from trtkv.bench.load.sessions import group_summary, plan_workload, run_sessions
from trtkv.contracts.bench_doc import OK
from trtkv.recipe import load_recipe


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir: Path) -> Any:
    return load_tokenizer(smollm2_dir)


def bench(*overrides: str) -> Any:
    return load_recipe("smollm2_fp8kv", ["bench.input_tokens=96", *overrides]).bench


def test_first_prompts_share_their_groups_prefix_tokens(tokenizer: Any) -> None:
    b = bench("bench.prefix.shared_tokens=64", "bench.prefix.groups=2", "bench.prefix.turns=2")
    work = plan_workload(tokenizer, b, 6)
    ids = [tokenizer.encode(s.first_prompt, add_special_tokens=True) for s in work.sessions]
    assert all(len(x) == 96 for x in ids)
    assert [s.group for s in work.sessions] == [0, 1, 0, 1, 0, 1]  # round-robin
    for s, x in zip(work.sessions, ids, strict=True):
        assert x[:64] == ids[s.group][:64]  # the group's prefix, token for token
    assert ids[0][:64] != ids[1][:64]
    assert len({tuple(x) for x in ids}) == 6  # each session its own text after the prefix
    assert plan_workload(tokenizer, b, 6).sessions == work.sessions  # the same workload every time


class Echo:
    """A Session that answers every prompt with ' ANSWER<n>' after a short wait and keeps what it was sent."""

    def __init__(self, sent: list[str], lock: threading.Lock) -> None:
        self.sent, self.lock = sent, lock

    def run(self, record: Any, prompt: str, params: Any, timeout_s: float) -> None:
        with self.lock:
            self.sent.append(prompt)
            n = len(self.sent)
        time.sleep(0.01)
        record.send_ns, record.response_ns = 1, [2]
        record.response_texts, record.response_tokens = [f" ANSWER{n}"], [1]
        record.status, record.end_ns = OK, 3

    def close(self) -> None:
        pass


def test_sessions_send_their_history_and_stop_at_num_requests(tokenizer: Any) -> None:
    b = bench("bench.prefix.shared_tokens=32", "bench.prefix.groups=2", "bench.prefix.turns=3",
              "bench.prefix.turn_tokens=8", "bench.prefix.think_time_s=0.05")
    work = plan_workload(tokenizer, b, 3)
    sent: list[str] = []
    lock = threading.Lock()
    pool = SessionPool(lambda: Echo(sent, lock), 2)
    t0 = time.monotonic()
    recs = run_sessions(pool, work, tokenizer, "concurrency=2", 2, 7, 10.0)
    assert time.monotonic() - t0 >= 0.1  # two think times in a session of three turns
    assert len(recs) == 7 and all(r.ok for r in recs)  # 7 of the 3 sessions x 3 turns: bounded by the count
    assert sorted(r.turn for r in recs).count(1) == 3
    # a later turn's prompt opens with its session's first prompt and holds the answer it got
    later = [p for p in sent if " ANSWER" in p]
    assert len(later) == 4 and all(any(p.startswith(s.first_prompt + " ANSWER") for s in work.sessions) for p in later)
    assert all(r.input_tokens > 96 for r in recs if r.turn and r.turn > 1)
    shape = group_summary(recs)
    assert shape["requests_per_turn"][1] == 3 and sum(shape["requests_per_group"].values()) == 7


VLLM_BEFORE = """# HELP vllm:prefix_cache_queries Prefix cache queries
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 200.0
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9
"""
VLLM_AFTER = VLLM_BEFORE.replace("1000.0", "3000.0").replace("200.0", "1400.0")
REFERENCE = """trtkv_prefix_cache_queries 512
trtkv_prefix_cache_hits{tier="device"} 256
trtkv_prefix_cache_hits{tier="host"} 128
"""


def test_counters_become_per_tier_deltas() -> None:
    before, after = parse_counters(VLLM_BEFORE), parse_counters(VLLM_AFTER)
    assert before == {"device": (1000.0, 200.0)}  # _created samples are not the counter
    level = level_prefix(before, after, "vllm", {})
    assert level.tiers["device"].queries == 2000 and level.tiers["device"].hits == 1200
    assert level.tiers["device"].hit_rate == pytest.approx(0.6)
    ref = parse_counters(REFERENCE)
    assert ref == {"device": (512.0, 256.0), "host": (512.0, 128.0)}
    assert parse_counters("nothing here 1\n") == {}


def test_a_prefix_level_against_the_openai_replay_server(tokenizer: Any) -> None:
    """The level runner end to end over the OpenAI client (tests/support/openai_replay.py, no model): warm-up, the
    sessions' turns, the counters read around them (the replay server has none: said in the source, no figures)."""
    from tests.support.openai_replay import start
    from trtkv.bench.load.prefix_levels import run_prefix_levels
    from trtkv.bench.transport.client import Endpoint
    from trtkv.bench.transport.openai import check_openai
    from trtkv.contracts.bench_doc import RequestRecord

    recipe = load_recipe("smollm2_fp8kv", ["bench.protocol=openai", "bench.input_tokens=64", "bench.output_tokens=3",
                                           "bench.concurrency=[2]", "bench.num_requests=6", "bench.warmup_requests=1",
                                           "bench.prefix.shared_tokens=32", "bench.prefix.turns=2",
                                           "bench.prefix.groups=2"])
    proc, port = start(first_ms=5.0, gap_ms=1.0)
    try:
        ep = check_openai(Endpoint(f"127.0.0.1:{port}", "openai", ""), 10.0)
        records: list[RequestRecord] = []
        by_level: dict[str, list[RequestRecord]] = {}
        prefix: dict[str, Any] = {}
        run_prefix_levels(recipe, ep, tokenizer, lambda _n, _t: (lambda _r: None), records, by_level, prefix)
    finally:
        proc.terminate()
        proc.join()
    measured = by_level["concurrency=2"]
    assert len(measured) == 6 and all(r.ok for r in measured), [r.error for r in measured]
    assert sorted(r.turn or 0 for r in measured) == [1, 1, 1, 2, 2, 2]
    assert {r.prefix_group for r in measured} == {0, 1}
    assert [r.phase for r in records].count("warmup") == 2  # one per slot at least
    level = prefix["concurrency=2"]
    assert level.tiers == {} and "/metrics" in level.source
    assert level.requests_per_turn == {1: 3, 2: 3}


# As SGLang 0.5.23 prints them with --enable-metrics (prometheus_client's text format; names, labels and the per-source
# label set from sglang/srt/observability/metrics_collector.py: tokenizer_metric_labels() gives model_name and
# engine_type, prompt_tokens_total adds is_streaming, cached_tokens_total adds cache_source and is only incremented, so
# only created, for a source with hits; the cache_hit_rate gauge is the scheduler's last report)
SGLANG_BEFORE = """# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{engine_type="unified",model_name="smollm2",tp_rank="0",pp_rank="0",dp_rank="0"} 0.5
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{engine_type="unified",is_streaming="true",model_name="smollm2"} 900.0
sglang:prompt_tokens_total{engine_type="unified",is_streaming="false",model_name="smollm2"} 100.0
sglang:prompt_tokens_created{engine_type="unified",is_streaming="true",model_name="smollm2"} 1.765e+09
# HELP sglang:cached_tokens_total Number of cached prompt tokens by source (device/host/storage).
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{cache_source="device",engine_type="unified",model_name="smollm2"} 400.0
sglang:cached_tokens_created{cache_source="device",engine_type="unified",model_name="smollm2"} 1.765e+09
"""
SGLANG_AFTER = (SGLANG_BEFORE.replace("} 900.0", "} 2900.0").replace("} 400.0", "} 1000.0")
                + 'sglang:cached_tokens_total{cache_source="host",engine_type="unified",model_name="smollm2"} 300.0\n')


def test_sglangs_counters_per_cache_source() -> None:
    """SGLang: prompt tokens (streaming or not) are the queries, cached tokens by source the hits; a source with no hit
    yet (no label set) counts 0, and the hit-rate gauge (the last batch's) is not taken for a level's rate."""
    before, after = parse_counters(SGLANG_BEFORE), parse_counters(SGLANG_AFTER)
    assert before == {"device": (1000.0, 400.0), "host": (1000.0, 0.0)}
    assert after == {"device": (3000.0, 1000.0), "host": (3000.0, 300.0)}
    level = level_prefix(before, after, "sglang", {})
    assert level.tiers["device"].queries == 2000 and level.tiers["device"].hit_rate == pytest.approx(0.3)
    assert level.tiers["host"].hits == 300 and level.tiers["host"].hit_rate == pytest.approx(0.15)
    assert parse_counters(SGLANG_BEFORE.split("# HELP sglang:prompt")[0]) == {}  # the gauge alone: nothing read
