"""The GenAI-Perf harness around perf_analyzer 2.51's empty-export bug, with a scripted stand-in for the genai-perf
executable (orchestration only: the real GenAI-Perf runs against the real server in tests/e2e/test_serve.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from benchmarks.genai_perf_crosscheck import EMPTY_EXPORT_TRIES, run_genai_perf
from trtkv.bench.transport.client import Endpoint
from trtkv.core.errors import TrtkvError

# Reads its plan ("empty", "fail" or "ok" per call) from plan.json beside it; writes what genai-perf would.
SCRIPT = """#!{python}
import json, sys
from pathlib import Path
here = Path(__file__).parent
plan = json.loads((here / "plan.json").read_text())
calls = here / "calls"
n = int(calls.read_text()) if calls.exists() else 0
calls.write_text(str(n + 1))
art = Path(sys.argv[sys.argv.index("--artifact-dir") + 1])
name = sys.argv[sys.argv.index("--profile-export-file") + 1]
run = art / "ensemble-triton-tensorrtllm-concurrency1"
run.mkdir(parents=True, exist_ok=True)
what = plan[min(n, len(plan) - 1)]
if what == "fail":
    print("tokenizer not found"); sys.exit(2)
if what == "empty":
    (run / name).write_text("")
    print("orjson.JSONDecodeError: Input is a zero-length, empty document"); sys.exit(1)
(run / name).write_text("{{}}")
(run / (name[:-5] + "_genai_perf.json")).write_text(json.dumps({{"request_count": {{"avg": 4}}}}))
"""


def _fake(tmp_path: Path, plan: list[str]) -> Path:
    exe = tmp_path / "bin" / "genai-perf"
    exe.parent.mkdir()
    exe.write_text(SCRIPT.format(python=sys.executable))
    exe.chmod(0o755)
    (exe.parent / "plan.json").write_text(json.dumps(plan))
    return exe


def _run(tmp_path: Path, exe: Path) -> dict[str, object]:
    return run_genai_perf(Endpoint("127.0.0.1:1", "grpc", "ensemble"), tmp_path, 16, 4, 1, 4, 1,
                          artifacts=tmp_path / "genai", timeout_s=60, exe=exe)


def test_an_empty_profile_export_is_retried_until_one_is_written(tmp_path: Path) -> None:
    exe = _fake(tmp_path, ["empty", "empty", "ok"])
    doc = _run(tmp_path, exe)
    assert doc == {"request_count": {"avg": 4}}
    assert (exe.parent / "calls").read_text() == "3"
    assert sorted(p.name for p in (tmp_path / "genai").glob("*.log")) == [
        "genai-perf-c1-try2.log", "genai-perf-c1-try3.log", "genai-perf-c1.log"]


def test_an_export_empty_every_time_fails_after_the_last_try(tmp_path: Path) -> None:
    exe = _fake(tmp_path, ["empty"])
    with pytest.raises(TrtkvError, match="profile export was empty every time"):
        _run(tmp_path, exe)
    assert (exe.parent / "calls").read_text() == str(EMPTY_EXPORT_TRIES)


def test_any_other_failure_is_not_retried(tmp_path: Path) -> None:
    exe = _fake(tmp_path, ["fail", "ok"])
    with pytest.raises(TrtkvError, match=r"(?s)genai-perf exited 2 \(log .*\):\n.*tokenizer not found"):
        _run(tmp_path, exe)
    assert (exe.parent / "calls").read_text() == "1"
