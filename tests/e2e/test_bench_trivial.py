"""The real client and CLI against the real tritonserver serving the trivial model (fast): protocols, consistency,
SLO exit codes, unreachable servers, timeouts counted, Ctrl-C partial results."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import read_results
from tests.support.localserver import free_port
from trtkv.bench.tasks.ruler import TASK_NAMES
from trtkv.cli import main
from trtkv.contracts.bench_doc import BenchResults, RequestRecord, RequestRecordDoc
from trtkv.measures.metrics import summarize_level

pytestmark = pytest.mark.e2e

WORKLOAD = ["bench.concurrency=[1,3]", "bench.num_requests=12", "bench.input_tokens=32", "bench.output_tokens=8",
            "bench.warmup_requests=1", "bench.thresholds=[]"]


def bench(url: str, out: Path, *extra: str, overrides: tuple[str, ...] = ()) -> int:
    return main(["bench", "smollm2_fp8kv", *WORKLOAD, *overrides, "--url", url, "--tasks", "none", "--no-progress",
                 "--output", str(out), *extra])


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_latency_run_is_consistent(trivial_server, engines_tmp: Path, tmp_path: Path, protocol: str) -> None:  # noqa: ANN001
    url = trivial_server.grpc_url if protocol == "grpc" else trivial_server.http_url
    assert bench(url, tmp_path / "out", "--protocol", protocol) == 0
    data = read_results(tmp_path / "out")
    assert set(data["levels"]) == {"concurrency=1", "concurrency=3"}
    records = [RequestRecord.from_doc(RequestRecordDoc(**r)) for r in data["records"]]
    measured = [r for r in records if r.phase == "latency"]
    assert len(measured) == 24 and all(r.ok for r in measured)
    assert {r.phase for r in records} == {"warmup", "latency"}  # warm-up kept in the raw records, left out of stats
    for r in measured:
        assert r.input_tokens == 32 and r.output_tokens() == 8 == sum(1 for t in r.response_texts if t)
        assert r.ttft_ms() <= r.request_latency_ms()
        assert r.send_ns < r.response_ns[0] <= r.response_ns[-1] <= r.end_ns
    for level, summary in data["levels"].items():
        again = summarize_level([r for r in measured if r.level == level])
        for metric in ("time_to_first_token", "inter_token_latency", "request_latency", "output_sequence_length",
                       "input_sequence_length"):
            assert again[metric]["p99"] == pytest.approx(summary[metric]["p99"], abs=1e-6)
        assert summary["output_token_throughput"]["avg"] > 0 and summary["request_count"]["failed"] == 0
    for name in ("results.json", "results.csv", "results.md", "requests.csv", "manifest.json",
                 "latency_distributions.png", "throughput.png"):
        assert (tmp_path / "out" / name).is_file(), name


def test_impossible_slo_exits_nonzero(trivial_server, engines_tmp: Path, tmp_path: Path,  # noqa: ANN001
                                      capsys: pytest.CaptureFixture[str]) -> None:
    code = bench(trivial_server.grpc_url, tmp_path / "out", "--slo", "time_to_first_token.p99<=0.0001",
                 "--slo", "request_throughput.avg>=1")
    assert code == 1
    out = capsys.readouterr().out
    assert "SLO breaches" in out and "time_to_first_token.p99<=0.0001" in out
    data = read_results(tmp_path / "out")
    assert data["slo"]["passed"] is False
    assert {r["slo"] for r in data["slo"]["results"] if not r["passed"]} == {"time_to_first_token.p99<=0.0001"}


def test_server_down_names_the_url(engines_tmp: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    assert bench(f"127.0.0.1:{port}", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert f"grpc://127.0.0.1:{port}" in err and "Traceback" not in err and "trtkv serve" in err
    assert not (tmp_path / "out").exists()


def test_model_not_ready_names_the_url(trivial_server, engines_tmp: Path, tmp_path: Path,  # noqa: ANN001
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert bench(trivial_server.grpc_url, tmp_path / "out", "--model", "nope") == 2
    err = capsys.readouterr().err
    assert trivial_server.grpc_url in err and "'nope' is not ready" in err and "ensemble=READY" in err


def test_timeouts_are_counted_not_dropped(trivial_server, engines_tmp: Path, tmp_path: Path) -> None:  # noqa: ANN001
    code = bench(trivial_server.grpc_url, tmp_path / "out", "--slo", "request_errors.failed<=0",
                 overrides=("bench.request_timeout_s=0.0001", "bench.concurrency=[2]", "bench.num_requests=6"))
    assert code == 1
    data = read_results(tmp_path / "out")
    counts = data["levels"]["concurrency=2"]["request_count"]
    assert counts["total"] == 6 and counts["failed"] == 6 and counts["timeout"] == 6
    assert sum(r["status"] == "timeout" for r in data["records"] if r["phase"] == "latency") == 6


def served_requests(metrics_port: int) -> float:
    """nv_inference_request_success of the trivial `ensemble` model, from tritonserver's metrics endpoint."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return 0.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("nv_inference_request_success{") and 'model="ensemble"' in line)


def test_ctrl_c_writes_partial_results(trivial_server, engines_tmp: Path, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "out"
    # a constant rate (not a closed loop), so the run lasts ~50 s on any machine and the SIGINT lands mid-run
    cmd = [sys.executable, "-m", "trtkv", "bench", "smollm2_fp8kv", *WORKLOAD, "bench.num_requests=5000",
           "bench.request_rate=100", "--url", trivial_server.grpc_url, "--tasks", "none", "--no-progress",
           "--output", str(out)]
    before = served_requests(trivial_server.metrics_port)  # the session's server has answered other tests already
    # SIGINT back to its default in the child: a shell that started this test run in the background (`make test &`)
    # set it to "ignore", which the child would inherit, and Python installs no KeyboardInterrupt handler then
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # interrupt once the server has answered some of this run's requests (a fixed sleep could land in the imports on
    # a loaded machine): the server's own request counter says when
    deadline = time.monotonic() + 120
    while (served_requests(trivial_server.metrics_port) < before + 300 and time.monotonic() < deadline
           and proc.poll() is None):
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, output
    assert "partial results" in output
    data = read_results(out.with_name("out.partial"))  # beside a complete run's results, never over them
    assert data["partial"] is True and data["interrupted_during"] == "latency sweep"
    latency = [r for r in data["records"] if r["phase"] == "latency"]
    assert len(latency) == 5000  # every request is accounted for: ok, cancelled or never sent
    statuses = {r["status"] for r in latency}
    assert "ok" in statuses and "not_sent" in statuses
    (level,) = data["levels"].values()
    assert level["request_count"]["ok"] > 0


def test_a_dead_shared_server_is_restarted_for_the_next_test(_trivial_servers, engines_tmp: Path,  # noqa: ANN001
                                                             tmp_path: Path) -> None:
    """The shared server fixture checks liveness and readiness per test (a refusing server once failed CI)."""
    first = _trivial_servers.ready()
    first.proc.kill()  # its own pid; tritonserver leads its own session
    first.proc.wait(timeout=30)
    second = _trivial_servers.ready()
    assert second is not first and second.proc.poll() is None
    assert bench(second.grpc_url, tmp_path / "out", "--slo", "request_errors.failed<=0") == 0


@pytest.mark.e2e
def test_bench_ruler_against_the_trivial_server(trivial_server, engines_tmp: Path, tmp_path: Path) -> None:  # noqa: ANN001
    from trtkv.cli import main

    out = tmp_path / "out"
    code = main(["bench", "smollm2_fp8kv", "bench.ruler_lengths=[1024]", "bench.ruler_samples=2", "bench.thresholds=[]",
                 "bench.concurrency=[2]", "--url", trivial_server.grpc_url, "--tasks", "ruler", "--no-latency",
                 "--no-progress", "--output", str(out)])
    assert code == 0
    data = BenchResults.load(out)  # read through results.json's model, RULER's figures per length typed
    assert data is not None
    scored = data.accuracy["ruler"]
    assert scored.total == 12 and scored.failed == 0 and scored.accuracy == 0.0  # it only answers " a a a"
    assert scored.by_length is not None and scored.items is not None and len(scored.items) == 12
    cells = scored.by_length["1024"].tasks
    assert list(cells) == list(TASK_NAMES) and all(c.n == 2 and c.score == 0.0 for c in cells.values())
    assert all(c.interval[0] == 0.0 and 0.5 < c.interval[1] < 1 for c in cells.values())  # Wilson for 0 of 2
    records = [r for r in data.records if r.phase == "ruler"]
    assert [r.max_tokens for r in records] == [128] * 6 + [30] * 2 + [120] * 2 + [50] * 2
    assert all(r.status == "ok" and len(r.response_texts) >= r.max_tokens for r in records)
    assert all(924 <= r.input_tokens + r.max_tokens <= 1024 for r in records if r.max_tokens != 50)
    md = (out / "results.md").read_text()
    assert "ruler @ 1024" not in md and "vt @ 1024: 0.00" in md and "average @ 1024: 0.00 over 6 tasks" in md

