"""The small frictions of the new-user trial (issue #37, item 4), each pinned: validate takes overrides like show and
plan; a rule broken through an override names the command line; no stray '?.'; a model path that is not there is
said (calibrate --dry-run fails, plan notes it); serve --help names the flag the command passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtkv.cli import main
from trtkv.core.errors import RecipeError
from trtkv.recipe import load_recipe


def test_validate_takes_overrides_as_show_and_plan_do(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "llama70b_fp8kv", "hardware.gpu=H200-141GB", "build.max_seq_len=65536"]) == 0
    assert "ok   llama70b_fp8kv" in capsys.readouterr().out
    assert main(["validate", "llama70b_fp8kv", "hardware.count=8"]) == 2
    err = capsys.readouterr().err
    assert "FAIL llama70b_fp8kv" in err and "unknown recipe" not in err


def test_a_rule_broken_by_an_override_names_the_command_line() -> None:
    with pytest.raises(RecipeError) as exc:
        load_recipe("llama70b_fp8kv", ["hardware.count=8"])  # reported at build.tp_size, which the file sets
    assert "llama70b_fp8kv.yaml with the <command line> overrides of hardware.count: build.tp_size:" in str(exc.value)
    with pytest.raises(RecipeError, match=r"<command line>: hardware.gpu: unknown GPU"):
        load_recipe("llama70b_fp8kv", ["hardware.gpu=T4"])


def test_did_you_mean_ends_its_sentence_once() -> None:
    with pytest.raises(RecipeError) as exc:
        load_recipe("llama8b_fp8kv", ["quantization.kv_cach=fp8"])
    text = str(exc.value)
    assert "did you mean 'kv_cache'? Allowed keys here:" in text and "?." not in text


def test_a_missing_local_model_is_said_by_calibrate_dry_run_and_plan(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    recipe = tmp_path / "gone.yaml"
    base = Path(__file__).resolve().parents[2] / "recipes" / "llama8b_fp8kv.yaml"
    recipe.write_text(f"include: {base}\nmodel:\n  source: ./no_such_model\n")
    assert main(["calibrate", str(recipe), "--dry-run"]) != 0
    assert "model.source './no_such_model': no model folder" in capsys.readouterr().err
    assert main(["plan", str(recipe)]) == 0
    assert " note(s): trtkv plan " in " ".join(capsys.readouterr().out.split())  # the answer counts them
    assert main(["plan", str(recipe), "--full"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # notes wrapped to the width
    assert "Note: " in out and "no_such_model': no model folder" in out
    assert main(["calibrate", "llama8b_fp8kv", "--dry-run"]) == 0  # a hub id not cached here: a note, not a failure
    assert "is a hub id that is not in this machine's HF cache" in capsys.readouterr().out


def test_serve_help_names_the_flag_the_command_passes(capsys: pytest.CaptureFixture[str]) -> None:
    from trtkv.backends import llmapi_serve

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert f"as {llmapi_serve.LLMAPI_OPTIONS_FLAG}" in " ".join(capsys.readouterr().out.split())
    recipe = load_recipe("llama70b_fp8kv_llmapi")
    assert llmapi_serve.LLMAPI_OPTIONS_FLAG in llmapi_serve.trtllm_serve_command(recipe, Path("/hf"), Path("/e/options.yaml"))
