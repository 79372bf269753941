"""Shared test fixtures. Stage outputs go to a temporary engines/ folder, never the checkout's."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Each pytest-xdist worker gets its share of the cores for torch's threads: two workers each running torch's
    default (one thread per core) put four OpenMP threads on 2 cores, which wait on one another at every op."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // workers))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-snapshots", action="store_true", default=False,
                     help="rewrite tests/data/snapshots/ from what trtkv writes now and print the diff (tests/snapshots)")


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """One torch thread for small-tensor tests: on a shared 2-core machine OpenMP spinning makes tiny ops ~20x slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture()
def engines_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point TRTKV_ENGINES and TRTKV_TRITON_REPO at a temp folder for one test."""
    engines = tmp_path / "engines"
    monkeypatch.setenv("TRTKV_ENGINES", str(engines))
    monkeypatch.setenv("TRTKV_TRITON_REPO", str(tmp_path / "triton_repo"))
    return engines


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The real SmolLM2-135M-Instruct as an HF folder (converted once from the packaged GGUF, then cached)."""
    from trtkv.checkpoints.models import resolve_model_dir
    from trtkv.recipe import load_recipe

    return resolve_model_dir(load_recipe("smollm2_fp8kv"))


# Small settings for the whole chain on the CPU recipe (issue: `make test` runs the chain end to end).
CHAIN_RECIPE = "smollm2_fp8kv"
CHAIN_OVERRIDES = [
    "calibration.num_samples=4", "calibration.seq_len=64", "calibration.batch_size=2",
    "triton.instance_count=1",
    "bench.concurrency=[1]", "bench.num_requests=3", "bench.warmup_requests=1", "bench.input_tokens=32",
    "bench.output_tokens=4", "bench.quiz_items=3", "bench.needle_context_lengths=[160]", "probe.needle_depths=[0.5]",
    "bench.thresholds=[]",
    # fidelity (a quantized-KV recipe's default task): tests/e2e/test_fidelity.py reads the chain's run as the healthy one
    "bench.fidelity_lengths=[256]", "bench.fidelity_documents=3", "bench.fidelity_tokens=8",
]


@pytest.fixture(scope="session")
def chain_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The whole chain (calibrate -> build -> repo -> serve -> bench -> report -> stop) on the CPU recipe with small
    settings, in temporary engines/ and triton_repo/ folders, run once per session as a user would (`trtkv demo`).

    Later e2e tests reuse its calibrated checkpoint and reference engine instead of calibrating again."""
    import os
    import subprocess
    import sys
    import time

    from trtkv.core.process import free_ports

    root = tmp_path_factory.mktemp("chain")
    http, grpc, metrics = free_ports(3)
    overrides = CHAIN_OVERRIDES + [f"triton.http_port={http}", f"triton.grpc_port={grpc}",
                                   f"triton.metrics_port={metrics}"]
    env = {**os.environ, "TRTKV_ENGINES": str(root / "engines"), "TRTKV_TRITON_REPO": str(root / "triton_repo")}
    start = time.time()
    proc = subprocess.run([sys.executable, "-m", "trtkv", "demo", CHAIN_RECIPE, *overrides], env=env,
                          capture_output=True, text=True, timeout=1800)
    return {"root": root, "engines": root / "engines", "recipe": CHAIN_RECIPE, "overrides": overrides,
            "returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr,
            "seconds": time.time() - start}


@pytest.fixture(scope="session")
def smollm2_engine(chain_run: dict) -> Path:
    """engines/smollm2_fp8kv with a calibrated checkpoint and a reference engine (from the chain run)."""
    folder = chain_run["engines"] / CHAIN_RECIPE
    if not (folder / "engine" / "runtime.json").is_file():
        pytest.fail(f"the chain did not build an engine (exit {chain_run['returncode']}):\n{chain_run['stderr'][-3000:]}")
    return folder


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses the session's whole chain run (`trtkv demo`: calibrate, build, serve, bench) is end to end,
    whatever its own markers say: `make check` (`-m "not e2e"`) never starts that chain."""
    for item in items:
        if "chain_run" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.e2e)
