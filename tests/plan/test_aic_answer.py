"""aiconfigurator's answer is untrusted input (issue 48): tools/aic_estimate.py's stdout is read while the tool runs,
at most the cap + 1 bytes and within its time limit (the tool killed past either); the answer's structure is checked by
a typed model (a wrong one falls back to trtkv's model with a one-line reason); non-finite numbers are refused where
they enter, and `plan --json` is always strict JSON. The tool is replaced by a small executable standing in for
.venv-aic's python (it ignores the script path it is given), so each answer's bytes are exactly the test's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from trtkv.cli import main
from trtkv.core.errors import TrtkvError
from trtkv.plan import aic

ROW = {"kv": "fp8", "concurrency": 1, "ttft_ms": 700.0, "itl_ms": 12.5, "tokens_per_s_per_gpu": 600.0,
       "tokens_per_s_per_user": 80.0, "backend": "vllm", "backend_version": "0.24.0", "system": "h100_sxm",
       "memory_gib": 40.0, "gemm": "fp8", "fmha": "fp8"}
PLAN = ["plan", "llama8b_fp8kv", "--estimate", "--json", "build.backend=vllm", "bench.concurrency=[1]",
        "hardware.gpu=H100-80GB"]


def _tool(folder: Path, body: str) -> Path:
    """An executable standing in for .venv-aic's python: runs `body` (Python) whatever arguments it gets."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "python"
    script.write_text(f"#!{sys.executable}\nimport os, sys, time\n{body}\n")
    script.chmod(0o755)
    return script


def _answering(folder: Path, text: str) -> Path:
    return _tool(folder, f"sys.stdin.read()\nsys.stdout.write({text!r})")


def _strict(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("doc, field", [
    ({"rows": None}, "rows"),
    ({"rows": {"0": ROW}}, "rows"),
    ({"rows": [ROW], "errors": None}, "errors"),
    ({"rows": [ROW], "errors": ["boom"]}, "errors[0]"),
    ({"rows": [{**ROW, "concurrency": True}]}, "rows[0].concurrency"),
    ({"rows": [{**ROW, "concurrency": 1.0}]}, "rows[0].concurrency"),
    ({"rows": [{**ROW, "itl_ms": "fast"}]}, "rows[0].itl_ms"),
    ({"rows": [{**ROW, "ttft_ms": 1e300}]}, "rows[0].ttft_ms"),
    ({"rows": [{**ROW, "kv": None}]}, "rows[0].kv"),
    ({"rows": [ROW], "aiconfigurator": ["0.12.0"]}, "aiconfigurator"),
])
def test_a_wrong_structure_is_one_line_naming_the_field(doc: dict[str, Any], field: str) -> None:
    """Before: `rows: null`, `errors: null` and a non-dict error ended in a TypeError/AttributeError traceback."""
    with pytest.raises(TrtkvError) as err:
        aic.parse_answer(json.dumps(doc))
    line = str(err.value)
    assert line.startswith(f"tools/aic_estimate.py: {field} = ") and "\n" not in line, line


@pytest.mark.parametrize("number", ["Infinity", "-Infinity", "NaN", "1e999"])
def test_a_non_finite_number_is_refused_where_it_enters(number: str) -> None:
    """Before: `"itl_ms": Infinity` passed (json.loads reads it; the check only refused NaN and negatives)."""
    text = json.dumps({"rows": [ROW]}).replace('"itl_ms": 12.5', f'"itl_ms": {number}')
    with pytest.raises(TrtkvError, match="tools/aic_estimate.py: "):
        aic.parse_answer(text)


@pytest.mark.parametrize("answer, said", [
    (json.dumps({"aiconfigurator": "0.12.0", "rows": None}), "rows = None"),
    (json.dumps({"aiconfigurator": "0.12.0", "rows": [ROW]}).replace("12.5", "Infinity"), "Infinity is not JSON"),
])
def test_plan_estimate_json_falls_back_and_stays_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str], answer: str,
                                                      said: str) -> None:
    """Before: `rows: null` ended `plan --estimate` in a TypeError traceback; an Infinity row reached `--json`, whose
    output then held `Infinity` (not JSON)."""
    monkeypatch.setattr(aic, "python_path", lambda: _answering(tmp_path, answer))
    assert main(PLAN) == 0
    est = _strict(capsys.readouterr().out)["estimate"]
    status = est["aiconfigurator"]
    assert status.startswith("aiconfigurator failed (") and said in status and status.endswith("trtkv model"), status
    assert all(level["source"].startswith("trtkv model") for f in est["formats"].values() for level in f["levels"])


def test_a_good_answer_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    """The typed model takes the tool's real answer shape (extra row fields included)."""
    answer = {"aiconfigurator": "0.12.0", "aiconfigurator_core": "0.12.0", "rows": [ROW, {**ROW, "kv": "bfloat16"}],
              "errors": [{"kv": "fp8", "concurrency": 8, "error": "no data"}]}
    monkeypatch.setattr(aic, "python_path", lambda: _answering(tmp_path, json.dumps(answer)))
    assert main(PLAN) == 0
    est = _strict(capsys.readouterr().out)["estimate"]
    assert est["aiconfigurator"].startswith("aiconfigurator 0.12.0 (core 0.12.0)"), est["aiconfigurator"]
    # vLLM also serves formats aiconfigurator has no data for: its figures stand beside trtkv's rows (one source per
    # level, tests/plan/test_aic_moe.py)
    assert est["formats"]["fp8"]["levels"][0]["aiconfigurator"]["itl_ms"] == 12.5


def test_plan_json_refuses_a_non_finite_figure() -> None:
    """`plan --json` is written with allow_nan=False: a non-finite figure is an error, never `NaN` in the output."""
    from dataclasses import replace

    from trtkv.plan.planner import plan
    from trtkv.recipe import load_recipe

    result = plan(load_recipe("llama8b_fp8kv"))
    bad = replace(result, kv_pool_bytes_per_gpu=float("nan"))
    with pytest.raises(TrtkvError, match="not finite"):
        bad.to_json()


def _peak_rss_mib(tool: Path, timeout_s: float) -> tuple[float, str, float]:
    """Run aic.run against `tool` in a fresh interpreter: (its peak RSS in MiB, the error, seconds). The peak is the
    interpreter's own VmHWM (getrusage's ru_maxrss keeps the parent's peak across exec: an xdist worker's)."""
    code = (
        "import time\nfrom pathlib import Path\nfrom trtkv.plan import aic\nt = time.monotonic()\n"
        f"try:\n    aic.run({{}}, python=Path({str(tool)!r}), timeout={timeout_s})\n    said = 'no error'\n"
        "except Exception as exc:\n    said = f'{type(exc).__name__}: {exc}'\n"
        "hwm = [line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM:')][0]\n"
        "print(int(hwm) / 1024, time.monotonic() - t)\nprint(said)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    first, said = done.stdout.strip().splitlines()[-2:]
    peak, seconds = (float(x) for x in first.split())
    return peak, said, seconds


def test_a_huge_answer_is_not_read_whole_and_the_tool_is_ended(tmp_path: Path) -> None:
    """Before: a 300 MB answer was read whole (capture_output) before the size check: `plan` peaked near 1 GB. Now
    at most the cap + 1 bytes are read and the tool is killed: the reader's peak stays near an idle interpreter's."""
    pid_file = tmp_path / "pid"
    tool = _tool(tmp_path / "big", f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
                                   "chunk = b' ' * (1 << 20)\nfor _ in range(300):\n    sys.stdout.buffer.write(chunk)")
    peak, said, _ = _peak_rss_mib(tool, 120)
    assert peak < 250, f"peak RSS {peak:.0f} MiB: the answer was read whole"
    assert said.startswith("TrtkvError: aiconfigurator (") and "answer larger than 1,048,576 bytes" in said, said
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists(), "the tool still runs after its answer was refused"


def test_a_tool_that_does_not_answer_is_ended_in_time(tmp_path: Path) -> None:
    tool = _tool(tmp_path / "slow", "sys.stdout.write('{'); sys.stdout.flush(); time.sleep(120)")
    _, said, seconds = _peak_rss_mib(tool, 2)
    assert said.startswith("TrtkvError: aiconfigurator (") and "took longer than 2 s" in said, said
    assert seconds < 20, seconds


def test_a_failure_is_said_without_this_machines_paths_and_cut_at_a_word() -> None:
    """aiconfigurator names its data folder by the absolute path its venv put it at; the estimate prints it from the
    package on, and a long failure cut at a word with `...` (it printed `.../site-packages/aiconfigura)`)."""
    venv = "/home/someone/proj/.venv-aic/lib/python3.11/site-packages"
    text = ("PerfDataNotAvailableError: perf database error: MoE data missing for MoeKey { quant: \"w4a8_mxfp4_mxfp8\", "
            "distribution: \"power_law_1.2\", topk: 4, num_experts: 128, hidden_size: 2880, inter_size: 2880, "
            f"moe_tp_size: 2, moe_ep_size: 1 }} at {venv}/aiconfigurator_core/systems/data/b200_sxm/trtllm/1.3.0rc20")
    doc = {"aiconfigurator": "0.12.0", "aiconfigurator_core": "0.12.0", "rows": [],
           "errors": [{"kv": "fp8", "concurrency": 4, "error": text}, {"kv": "fp8", "concurrency": 8, "error": "word " * 99}]}
    answer = aic.answer_of(doc, "test")
    said = answer.errors[0]
    assert "/home/someone" not in said and said.endswith("at aiconfigurator_core/systems/data/b200_sxm/trtllm/1.3.0rc20")
    assert len(answer.errors[1]) <= aic.ERROR_CHARS and answer.errors[1].endswith("word ...")
    assert answer.failures[0] == ("fp8", 4, said)
