"""Fault injection on a real served backend that the other e2e modules do not already cover: the llmapi layout (the
bundled tritonserver running upstream's one-model llmapi layout with the Python stub), served by `trtkv serve` with
its supervisor. Its main process is SIGKILLed; expected: the supervisor ends the rest of the session (`cleaned: N
processes`), restarts, and a real canary answers within 90 s; nothing of the dead session survives; when `trtkv stop`
returns, no process of either session is left (issue 56) and every port is free (benchmarks/faults.py, also run by
`make soak`).

The other local backends: the Triton ensemble's faults (a stub killed under load, then kill the supervisor; the
main-process kill is this module's, an interrupted start is `make soak`'s) run in tests/e2e/test_serve.py's short soak
(benchmarks/soak.py); vLLM's (kill EngineCore, ...) in `make soak RECIPE=smollm2_fp8kv_vllm` only: a second vLLM start
(~3 min here) is over budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CHAIN_OVERRIDES
from trtkv.build.stage import build
from trtkv.recipe import load_recipe
from trtkv.repo import generate_repo

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
LLMAPI = "smollm2_fp8kv_llmapi"


def test_llmapi_server_heals_from_a_killed_main_process(tmp_path: Path, smollm2_engine: Path) -> None:
    engines = tmp_path / "engines"
    (engines / LLMAPI).mkdir(parents=True)
    (engines / LLMAPI / "checkpoint").symlink_to(smollm2_engine / "checkpoint")
    env = {**os.environ, "TRTKV_ENGINES": str(engines), "TRTKV_TRITON_REPO": str(tmp_path / "triton_repo")}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRTKV_ENGINES", env["TRTKV_ENGINES"])
        mp.setenv("TRTKV_TRITON_REPO", env["TRTKV_TRITON_REPO"])
        recipe = load_recipe(LLMAPI, CHAIN_OVERRIDES)
        build(recipe, log=print)
        generate_repo(recipe, log=print)
    out = tmp_path / "faults.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "faults.py"), LLMAPI, *CHAIN_OVERRIDES,
                           "--faults", "main", "--output", str(out)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=600)
    print(proc.stdout[-3000:])
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    results = {r["fault"]: r for r in json.loads(out.read_text())}
    main = results["main"]
    assert main["passed"] and main["left"] == [] and main["healed_s"] < 90, main
    assert "cleaned:" in main["detail"], main
    assert results["ports"]["passed"], results["ports"]
    # issue 56: nothing of the first session nor of the restarted one (its tritonserver and Python stub) is left
    # when `trtkv stop` returns
    assert results["stop"]["passed"], results["stop"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
