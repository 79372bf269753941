"""Words that misled a first-time user (#54 item 8), each checked in what trtkv prints: no "activation reserve" (gone
from the planner, docs/plan.md), vLLM-only advice only on vLLM recipes, kernel data named as what it is beside the
served engine's version, a GPU name said once, and `probe` saying which attention mode applies to which asked
format."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.planned import deploy
from trtkv.cli import main
from trtkv.core.errors import RecipeError
from trtkv.deploy import Target
from trtkv.recipe import load_recipe

DOCS = Path(__file__).parents[2] / "docs"


def test_deploy_speaks_of_the_engines_pool_not_an_activation_reserve(tmp_path: Path) -> None:
    said: list[str] = []
    out = deploy(load_recipe("llama70b_fp8kv"), Target.SLURM, tmp_path / "s", log=said.append)
    for text in ("\n".join(said), (out / "README.md").read_text(), (DOCS / "deploy.md").read_text()):
        assert "activation reserve" not in text
        assert "tokens per GPU in the KV pool the engine's own memory rule leaves" in text


def plan_text(name: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["plan", name, "--full"]) == 0  # the advice and notes: behind --full since #54 item 9
    return " ".join(capsys.readouterr().out.split())  # its prose is wrapped to the terminal: words joined


def test_vllm_advice_only_on_vllm_and_kernel_versions_said_as_data(capsys: pytest.CaptureFixture[str]) -> None:
    trt = plan_text("llama70b_fp8kv", capsys)
    assert "int8_per_token_head" not in trt  # vLLM's format: not advice for a TensorRT-LLM recipe
    assert "with trtllm 1.3.0rc20 kernels" not in trt
    assert "kernel data measured on TensorRT-LLM 1.3.0rc20 (aiconfigurator's tables; the served engine is " \
           "TensorRT-LLM 1.2.1" in trt
    vllm = plan_text("llama70b_fp8kv_attnhead_vllm", capsys)
    assert "`--kv-cache-dtype int8_per_token_head` is the INT8 without calibration" in vllm


def test_an_unknown_gpu_is_named_once() -> None:
    with pytest.raises(RecipeError) as err:
        load_recipe("llama70b_fp8kv", ["hardware.gpu=H100-PCIE-99GB"])
    assert str(err.value).count("H100-PCIE-99GB") == 1, str(err.value)


def test_probe_says_which_mode_applies_to_which_asked_format(capsys: pytest.CaptureFixture[str]) -> None:
    """TensorRT-LLM's FP8 kernels read ModelOpt's clamped scale (fp8_scale1): calibrated fp8 is measured cache-only
    there, and probe says so and how to measure the engine's own."""
    main(["probe", "llama8b_fp8kv", "--attention", "auto", "--formats", "fp8,fp8_scale1", "--dry-run"])
    out = capsys.readouterr().out
    assert "probe: fp8 is measured cache-only; not under trtllm_fp8_fmha_sm90" in out
    assert "add --formats fp8_scale1 to measure that under trtllm_fp8_fmha_sm90" in out
    assert "probe: fp8_scale1 is measured cache-only and under trtllm_fp8_fmha_sm90" in out
