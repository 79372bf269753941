"""perf_analyzer from tritonclient==2.51.0's wheel (the last one that runs on glibc 2.36), set up outside the venv.

The wheel is fetched once with `pip download` into ~/.cache/trtkv/perf_analyzer (TRTKV_CACHE moves it), unzipped
there (so it never replaces the client library in the venv), and run with LD_LIBRARY_PATH on a folder linking the
two libraries it needs to the copies nvidia-pytriton ships: libb64.so.0d and libcudart.so.12.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trtkv.core import paths
from trtkv.core.errors import ToolError
from trtkv.core.tools import run_logged

VERSION = "2.51.0"
WHEEL = f"tritonclient-{VERSION}-py3-none-manylinux1_x86_64.whl"
LIB_LINKS = {"libb64.so.0d": "libb64-*.so.0d", "libcudart.so.12": "libcudart-*.so.12*"}


def home() -> Path:
    return paths.cache_dir() / "perf_analyzer"


def binary() -> Path:
    return home() / "unpacked" / f"tritonclient-{VERSION}.data" / "data" / "bin" / "perf_analyzer"


def lib_dir() -> Path:
    return home() / "lib"


def ensure() -> Path:
    """The perf_analyzer binary, downloading and unpacking the wheel the first time."""
    exe = binary()
    if not exe.is_file():
        wheel = home() / "wheel" / WHEEL
        if not wheel.is_file():
            run_logged([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        f"tritonclient=={VERSION}", "-d", str(wheel.parent)], home() / "download.log", echo=False,
                       hint=f"perf_analyzer comes from the tritonclient=={VERSION} wheel; pip must reach the index.")
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(home() / "unpacked")
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    _link_libs()
    return exe


def _link_libs() -> None:
    import importlib.util

    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise ToolError("perf_analyzer needs libb64/libcudart from nvidia-pytriton, which is not installed.")
    libs = Path(next(iter(spec.submodule_search_locations))).parent / "nvidia_pytriton.libs"
    lib_dir().mkdir(parents=True, exist_ok=True)
    for name, pattern in LIB_LINKS.items():
        found = sorted(libs.glob(pattern))
        if not found:
            raise ToolError(f"perf_analyzer needs {name}: no {pattern} in {libs}.")
        link = lib_dir() / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(found[0])


def env() -> dict[str, str]:
    out = dict(os.environ)
    out["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(lib_dir()), out.get("LD_LIBRARY_PATH", "")) if p)
    return out


def input_data(path: Path, prompts: Sequence[str], max_tokens: int) -> Path:
    """perf_analyzer --input-data JSON: one entry per prompt (it cycles through them), streaming on."""
    data = [{"text_input": {"content": [p], "shape": [1]}, "max_tokens": {"content": [max_tokens], "shape": [1]},
             "stream": {"content": [True], "shape": [1]}} for p in prompts]
    path.write_text(json.dumps({"data": data}))
    return path


def run(url: str, model: str, data: Path, concurrency: int, work: Path, *, window_requests: int,
        stability_pct: float = 50.0, max_trials: int = 10, timeout_s: float = 600.0) -> dict[str, Any]:
    """One concurrency level in count_windows mode; returns its export (every request's timestamps) and CPU time."""
    tag = f"{data.stem}_c{concurrency}"
    export, report, log = work / f"pa_export_{tag}.json", work / f"pa_report_{tag}.csv", work / f"pa_{tag}.log"
    for old in (export, report):  # perf_analyzer refuses an export path that exists
        old.unlink(missing_ok=True)
    cmd = [str(ensure()), "-m", model, "-u", url, "-i", "grpc", "--streaming", "--input-data", str(data),
           "--measurement-mode", "count_windows", "--measurement-request-count", str(window_requests),
           "--concurrency-range", f"{concurrency}:{concurrency}:1", "-s", f"{stability_pct:g}", "-r", str(max_trials),
           "--profile-export-file", str(export), "-f", str(report)]
    before = os.times()
    proc = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=timeout_s, check=False)
    after = os.times()
    log.write_text(" ".join(cmd) + "\n" + proc.stdout + proc.stderr)
    if proc.returncode != 0 or not export.is_file():
        lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
        first_error = next((ln.strip() for ln in lines if "rror" in ln or "Failed" in ln), lines[-1] if lines else "")
        raise ToolError(f"perf_analyzer exited with code {proc.returncode}: {first_error} (log {log})")
    cpu_s = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return {"export": json.loads(export.read_text()), "report_csv": report.read_text() if report.is_file() else "",
            "cpu_seconds": cpu_s, "command": cmd}


def export_metrics(export: dict[str, Any], last_windows: int = 3) -> dict[str, Any]:
    """TTFT, request latency (ms) and request throughput from the export, over the last (stable) windows."""
    exp = export["experiments"][-1]
    bounds = exp.get("window_boundaries") or []
    start_ns = bounds[-(last_windows + 1)] if len(bounds) > last_windows else (bounds[0] if bounds else 0)
    end_ns = bounds[-1] if bounds else None
    reqs = [r for r in exp["requests"] if r["timestamp"] >= start_ns and r["response_timestamps"]
            and (end_ns is None or r["timestamp"] < end_ns)]
    ttft = [(r["response_timestamps"][0] - r["timestamp"]) / 1e6 for r in reqs]
    latency = [(r["response_timestamps"][-1] - r["timestamp"]) / 1e6 for r in reqs]
    responses = sum(len(r["response_timestamps"]) for r in reqs)
    span_s = ((end_ns or max(r["response_timestamps"][-1] for r in reqs)) - start_ns) / 1e9 if reqs else 0.0
    from trtkv.measures.stats import summarize

    return {"requests": len(reqs), "responses": responses, "time_to_first_token": summarize(ttft),
            "request_latency": summarize(latency), "request_throughput": len(reqs) / span_s if span_s else 0.0}
