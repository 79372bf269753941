"""`trtkv generate` on the real SmolLM2 engine of the session's chain run: the reference runtime reads the TensorRT-LLM
checkpoint as TensorRT-LLM does, so a broken `rotary_base` shows up as broken text."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trtkv.cli import main

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
PROMPT = "The capital of France is"


@pytest.fixture()
def chain_engines(smollm2_engine: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TRTKV_ENGINES", str(smollm2_engine.parent))
    return smollm2_engine


def test_generate_answers_paris_and_a_far_off_rotary_base_does_not(chain_engines: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    config = json.loads((chain_engines / "checkpoint" / "config.json").read_text())
    assert config["rotary_base"] == 100000.0 and config["rotary_scaling"] is None  # SmolLM2's rope_theta
    assert main(["generate", "smollm2_fp8kv", "--prompt", PROMPT, "--max-tokens", "4"]) == 0
    assert "Paris" in capsys.readouterr().out

    broken = tmp_path / "checkpoint"
    shutil.copytree(chain_engines / "checkpoint", broken)
    (broken / "config.json").write_text(json.dumps({**config, "rotary_base": 1.0}))
    assert main(["generate", "smollm2_fp8kv", "--prompt", PROMPT, "--max-tokens", "4", "--checkpoint", str(broken)]) == 0
    assert "Paris" not in capsys.readouterr().out


def test_generate_says_what_is_missing(engines_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "smollm2_fp8kv", "--prompt", PROMPT]) != 0
    err = capsys.readouterr().err
    assert "runtime.json: missing" in err and "trtkv build smollm2_fp8kv" in err
