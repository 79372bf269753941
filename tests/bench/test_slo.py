"""SLO parsing (recipe thresholds and --slo) and checking against level summaries and accuracy results."""

from __future__ import annotations

import pytest

from trtkv.bench.outputs import slo
from trtkv.contracts import BenchLevel, TaskScore
from trtkv.core.errors import TrtkvError


def test_parse_forms() -> None:
    s = slo.parse_slo("time_to_first_token.p99<=500")
    assert (s.metric, s.stat, s.op, s.value) == ("time_to_first_token", "p99", "<=", 500.0)
    assert slo.parse_slo(" quiz.accuracy >= 0.3 ").op == ">="
    assert slo.parse_slo("output_token_throughput.avg>1e2").value == 100.0
    assert slo.parse_slo("request_errors.failed<=0").metric == "request_errors"


@pytest.mark.parametrize(("text", "fragment"), [
    ("ttft.p99<=5", "unknown metric 'ttft'"),
    ("time_to_first_token.p42<=5", "no stat 'p42'"),
    ("quiz.p99>=0.3", "no stat 'p99'"),
    ("time_to_first_token<=5", "expected METRIC.STAT"),
    ("time_to_first_token.p99=5", "expected METRIC.STAT"),
])
def test_parse_errors_name_the_problem(text: str, fragment: str) -> None:
    with pytest.raises(TrtkvError, match=fragment.replace("(", r"\(")):
        slo.parse_slo(text)


def _level(ttft_p99: float, failed: int = 0) -> BenchLevel:
    return BenchLevel.model_validate({"time_to_first_token": {"p99": ttft_p99, "avg": ttft_p99 / 2},
                                      "output_token_throughput": {"avg": 50.0},
                                      "request_count": {"total": 10, "failed": failed}})


def _tasks(**entries: dict) -> dict[str, TaskScore]:
    return {name: TaskScore.model_validate(entry) for name, entry in entries.items()}


def test_check_every_level_and_task() -> None:
    slos = slo.parse_all(["time_to_first_token.p99<=500"], ["quiz.accuracy>=0.3", "request_errors.failed<=0",
                                                            "output_token_throughput.avg>=40"])
    levels = {"concurrency=1": _level(100.0), "concurrency=4": _level(900.0, failed=2)}
    res = slo.check(slos, levels, _tasks(quiz={"accuracy": 0.25}))
    failed = {(r.slo.text, r.where) for r in res if not r.passed}
    assert failed == {("time_to_first_token.p99<=500", "concurrency=4"), ("quiz.accuracy>=0.3", "quiz"),
                      ("request_errors.failed<=0", "concurrency=4")}
    assert res[0].slo.source == "recipe bench.thresholds"


def test_not_measured_fails() -> None:
    res = slo.check([slo.parse_slo("needle.accuracy>=0.5")], {}, {})
    assert len(res) == 1 and not res[0].passed and res[0].measured is None
    res = slo.check([slo.parse_slo("time_to_first_token.p99<=5")], {}, {})
    assert not res[0].passed and res[0].where == "(no latency run)"


def test_failed_requests_fail_the_bench_unless_allowed() -> None:
    implicit = slo.parse_all([], [])
    assert [s.text for s in implicit] == ["request_errors.failed<=0"] and "allow-failures" in implicit[0].source
    assert slo.parse_all([], [], allow_failures=True) == []
    assert [s.text for s in slo.parse_all([], ["request_errors.rate<=0.1"])] == ["request_errors.rate<=0.1"]
    # failed requests of an accuracy task count too, also without a latency run
    res = slo.check(implicit, {}, _tasks(quiz={"accuracy": 0.5, "total": 4, "failed": 1}))
    assert [(r.where, r.measured, r.passed) for r in res] == [("quiz", 1.0, False)]
    res = slo.check(implicit, {"concurrency=1": _level(1.0)}, _tasks(quiz={"accuracy": 1.0, "total": 4, "failed": 0}))
    assert all(r.passed for r in res) and len(res) == 2
