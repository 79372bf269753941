"""`trtkv demo` on the CPU recipe with small settings: every stage runs for real, the summary is printed, every
artifact is where the summary says, and no server is left running."""

from __future__ import annotations

import json
import os

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_whole_chain_runs_and_stops_the_server(chain_run: dict) -> None:
    out, err = chain_run["stdout"], chain_run["stderr"]
    assert chain_run["returncode"] == 0, f"stdout:\n{out[-4000:]}\nstderr:\n{err[-4000:]}"
    print(f"\nwhole chain in {chain_run['seconds']:.0f} s")
    engines = chain_run["engines"] / chain_run["recipe"]
    for stage in ("checkpoint", "engine", "serve", "bench"):  # every stage folder has its manifest
        assert (engines / stage / "manifest.json").is_file(), stage
    assert (chain_run["root"] / "triton_repo" / chain_run["recipe"] / "ensemble" / "config.pbtxt").is_file()
    # the summary: accuracy, latency, throughput, KV bytes and planner capacity, all measured
    assert "Summary for smollm2_fp8kv" in out
    for words in ("quiz.accuracy", "golden.agreement", "TTFT p50", "ITL p50", "output tokens/s", "bytes/token",
                  "KV budget"):
        assert words in out, words
    report = json.loads((engines / "report" / "report.json").read_text())
    assert json.loads((engines / "report" / "manifest.json").read_text())["stage"] == "report"
    results = json.loads((engines / "bench" / "results.json").read_text())
    level = results["levels"]["concurrency=1"]
    assert report["bench"]["time_to_first_token.p50"] == level["time_to_first_token"]["p50"]
    assert report["kv_bytes_per_token"] == 2 * 30 * 3 * 64 * 1  # 30 layers, 3 KV heads, head_dim 64, 1 byte
    assert {"checkpoint", "engine", "serve", "bench", "triton_repo"} <= set(report["stages"])
    assert report["stages"]["serve"]["wall_seconds"] > 0  # the server's ready time, from serve/manifest.json
    # planned against served: the reference runtime's own pool line, read back by the bench, is the plan's pool
    pool = results["kv_pool"]
    print(f"KV pool per GPU: planned {pool['planned_bytes_per_gpu']:,.0f} bytes, served "
          f"{pool['served_bytes_per_gpu']:,.0f} bytes ({pool['source']})")
    assert pool["source"].startswith("reference runtime log"), pool
    assert pool["served_bytes_per_gpu"] == pytest.approx(pool["planned_bytes_per_gpu"], rel=0.01), pool
    assert pool["warning"] is None and not results.get("warnings")
    # the server was started by the chain and stopped by it
    assert not (engines / "serve" / "server.json").exists()
    for line in out.splitlines():
        if "pid" in line and "tritonserver" in line:
            pid = int("".join(ch for ch in line.split("pid", 1)[1][:12] if ch.isdigit()) or 0)
            status = f"/proc/{pid}/status"
            if pid and os.path.exists(status):
                state = next(ln for ln in open(status).read().splitlines() if ln.startswith("State:"))
                assert "Z" in state, f"tritonserver pid {pid} still running: {state}"
