"""The real aiconfigurator (its own venv, `make install-aiconfigurator`, which `make test` builds) answers trtkv's
adapter: one recorded case reproduced live, and `trtkv plan --estimate` naming it as the source of its covered rows."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import speed_cases as sc
from trtkv.cli import main
from trtkv.plan import aic

pytestmark = [pytest.mark.e2e]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def aic_python() -> None:
    if not aic.python_path().is_file():
        pytest.fail(f"{aic.python_path()} missing: run `make install-aiconfigurator` (make test does).")


def test_recorded_case_reproduces_live(aic_python: None) -> None:
    case = next(c for c in sc.aic_cases()["cases"] if c["gpu"] == "H100-80GB" and c["backend"] == "vllm"
                and c["kv"] == "fp8" and c["concurrency"] == 16)
    req = {**case["request"], "model_path": str(sc.ROOT / case["model_config"]),
           "cases": [{"kv": case["kv"], "concurrency": case["concurrency"]}]}
    answer = aic.run(req)
    assert answer.version == aic.AIC_VERSION and not answer.errors
    live = answer.rows[0]
    assert live.itl_ms == pytest.approx(case["row"]["itl_ms"], rel=1e-6)
    assert live.ttft_ms == pytest.approx(case["row"]["ttft_ms"], rel=1e-6)


def test_plan_estimate_names_aiconfigurator(aic_python: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "llama8b_fp8kv", "--estimate", "--json", "build.backend=vllm", "bench.input_tokens=4096",
                 "bench.output_tokens=256", "bench.concurrency=[4]"]) == 0
    est = json.loads(capsys.readouterr().out)["estimate"]
    # vLLM also serves int8_per_token_head, which aiconfigurator has no data for: the level is trtkv's model on every
    # row (one source per comparison), aiconfigurator's own figures beside fp8 and bf16
    fp8, bf16 = est["formats"]["fp8"]["levels"][0], est["formats"]["bf16"]["levels"][0]
    assert fp8["aiconfigurator"]["source"] == "aiconfigurator 0.12.0 (vllm 0.24.0 data, h100_sxm)"
    assert bf16["aiconfigurator"]["source"].startswith("aiconfigurator 0.12.0")
    assert all(f["levels"][0]["source"].startswith("trtkv model") for f in est["formats"].values())
    assert "has no KV data for int8_per_token_head" in est["aiconfigurator"]


def test_plan_estimate_of_a_moe_model_is_aiconfigurators(aic_python: None, capsys: pytest.CaptureFixture[str]) -> None:
    """Qwen3-30B-A3B on the LLM API at TP2 (fp8 and bf16 KV: both in aiconfigurator's data): aiconfigurator answers
    with the recipe's MoE parallelism (before: `At least one of moe_tp_size or moe_ep_size must be set`), every row at
    concurrency 1; at 16 it finds bf16 out of memory (as recorded in moe_cases.json), so that level is trtkv's model on
    both rows, said once with the reason."""
    recipe = sc.recipe_for("tests/data/configs/qwen3_30b_a3b", "H100-80GB", "llmapi", "bf16", 2048, 256, [1, 16],
                           8192, tp=2)
    from trtkv.plan.estimate import estimate
    from trtkv.plan.planner import plan

    est = estimate(recipe, plan(recipe))
    assert "moe_tp_size" not in est.aiconfigurator, est.aiconfigurator
    at = {c: {r.source for r in est.rows if r.concurrency == c} for c in (1, 16)}
    assert at[1] == {"aiconfigurator 0.12.0 (trtllm 1.3.0rc20 data, h100_sxm)"}, est.aiconfigurator
    assert len(at[16]) == 1 and next(iter(at[16])).startswith("trtkv model"), est.aiconfigurator
    assert "its bf16 case at concurrency 16 failed: RuntimeError: OOM" in est.aiconfigurator


def test_system_map_is_what_the_installed_aiconfigurator_ships(aic_python: None) -> None:
    """trtkv.plan.speed.AIC_SYSTEM maps a GPU onto every system the installed aiconfigurator-core has kernel tables for
    (a `gemm` table folder; but gb300, which GPU_SPECS has no GPU for, and b60, not an NVIDIA GPU); each newly mapped
    one answers live, and a datasheet-only system (h100_pcie) is refused by aiconfigurator itself, which is why trtkv
    does not ask it there."""
    import subprocess

    from trtkv.plan import speed

    script = ("import os, aiconfigurator_core as a; d = os.path.join(os.path.dirname(a.__file__), 'systems', 'data'); "
              "print(' '.join(sorted(s for s in os.listdir(d) if os.path.isdir(os.path.join(d, s, 'gemm')))))")
    shipped = set(subprocess.run([str(aic.python_path()), "-c", script], capture_output=True, text=True, check=True,
                                 timeout=120).stdout.split())
    assert set(speed.AIC_SYSTEM.values()) == shipped - {"gb300", "b60"}, shipped
    case = next(c for c in sc.aic_cases()["cases"] if c["gpu"] == "H100-80GB" and c["backend"] == "vllm")
    base = {**case["request"], "model_path": str(sc.ROOT / case["model_config"]), "cases": [{"kv": "fp8", "concurrency": 4}]}
    answers = aic.run_many({"requests": [{**base, "system": s} for s in ("b300_sxm", "gb200", "rtx_pro_6000_server",
                                                                          "h100_pcie")]})
    for system, answer in zip(("b300_sxm", "gb200", "rtx_pro_6000_server"), answers, strict=False):
        assert answer.rows and answer.rows[0].system == system and answer.rows[0].itl_ms > 0, (system, answer.errors)
    assert not answers[3].rows and "No database found for system=h100_pcie" in answers[3].errors[0]


def test_found_from_another_folder_with_trtkv_home_unset(aic_python: None, tmp_path: Path) -> None:
    """trtkv laid out as an installed wheel (a copy of the package, no checkout above it), run from a project folder of
    the user's own with TRTKV_HOME unset, in this checkout's venv: aiconfigurator beside it answers (#54 item 5)."""
    site, project = tmp_path / "site", tmp_path / "project"
    project.mkdir()
    shutil.copytree(ROOT / "trtkv", site / "trtkv", ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("TRTKV_HOME", "TRTKV_AICONFIGURATOR")}
    done = subprocess.run([sys.executable, "-m", "trtkv", "plan", str(ROOT / "recipes/llama8b_fp8kv.yaml"),
                           "--estimate", "--json", "build.backend=vllm", "bench.concurrency=[4]"],
                          cwd=project, env={**env, "PYTHONPATH": str(site)}, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    est = json.loads(done.stdout)["estimate"]
    assert est["aiconfigurator"].startswith("aiconfigurator 0.12.0"), est["aiconfigurator"]
    assert est["formats"]["fp8"]["levels"][0]["aiconfigurator"]["source"] == (
        "aiconfigurator 0.12.0 (vllm 0.24.0 data, h100_sxm)")
