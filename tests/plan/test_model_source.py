"""The planner reads the model config from where calibration and serving find the model (one resolver,
trtkv.checkpoints.models.source_dir): a model.source relative to the project root or the working directory, not only to
the recipe file. Before, `trtkv plan llama70b_fp8kv_llmapi model.source=tests/data/configs/gpt_oss_120b` from the
project root planned the recipe's own Llama-3.3-70B fields (70.6B parameters), silently: the planner looked beside the
recipe file only, while the checkpoint resolver found the folder, so no note said the config was not read. A folder
found without config.json (tokenizer files only) was planned from the recipe's fields without a note too."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from trtkv.checkpoints import local_model_dir
from trtkv.engines import model_config_path
from trtkv.plan.model import resolve_architecture
from trtkv.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]
GPT_OSS = ROOT / "tests" / "data" / "configs" / "gpt_oss_120b"
# the llama recipe's own geometry, which a gpt-oss config must replace (the clash check needs them gone)
UNSET = [f"model.{k}=null" for k in ("num_layers", "head_dim", "hidden_size", "intermediate_size", "vocab_size",
                                     "num_attention_heads", "num_kv_heads", "num_parameters")]


@pytest.mark.parametrize("base", ["project root", "working directory"])
def test_a_source_relative_to_the_project_or_the_shell_is_planned_from_its_config(
        base: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if base == "project root":
        source = str(GPT_OSS.relative_to(ROOT))
        monkeypatch.chdir(tmp_path)  # not found from the shell's folder: the project root's
    else:
        shutil.copytree(GPT_OSS, tmp_path / "models" / "gpt-oss")
        source = "models/gpt-oss"
        monkeypatch.chdir(tmp_path)
    recipe = load_recipe("llama70b_fp8kv_llmapi", [f"model.source={source}", *UNSET])
    cfg = model_config_path(recipe)
    assert cfg is not None and cfg.parent == local_model_dir(recipe)
    arch = resolve_architecture(recipe)
    assert arch.source != "recipe" and arch.num_layers == 36 and arch.moe is not None


def test_a_source_found_nowhere_is_planned_from_the_recipe_with_a_note(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from trtkv.plan.planner import plan

    monkeypatch.chdir(tmp_path)
    recipe = load_recipe("llama70b_fp8kv_llmapi", ["model.source=models/gpt-oss/nowhere"])
    assert model_config_path(recipe) is None and resolve_architecture(recipe).source == "recipe"
    (note,) = [n for n in plan(recipe).notes if "models/gpt-oss/nowhere" in n]
    assert "no model folder" in note and str(tmp_path / "models" / "gpt-oss" / "nowhere") in note
    assert note.endswith("planned from the recipe's model fields alone.")


def test_a_folder_found_without_a_config_is_said_once_in_text_and_json(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A folder that holds tokenizer files but no config.json was resolved (calibrate finds it, then refuses it) while
    the plan fell back to the recipe's fields without a word: now one note names the folder, the field and the next
    step; with the config beside the tokenizer the note goes and the config is read."""
    import json

    from trtkv.cli import main

    folder = tmp_path / "models" / "llama3" / "tokenizer-only"
    folder.mkdir(parents=True)
    (folder / "tokenizer_config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    args = ["plan", "llama70b_fp8kv_llmapi", "model.source=models/llama3/tokenizer-only"]
    said = f"model.source 'models/llama3/tokenizer-only': the folder {folder.resolve()} was found but holds no config.json"
    assert main([*args, "--full"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # notes wrapped to the width
    assert text.count(said) == 1 and text.count("holds no config.json") == 1
    assert main([*args, "--json"]) == 0
    (note,) = [n for n in json.loads(capsys.readouterr().out)["notes"] if "config.json" in n and str(folder) in n]
    assert note.startswith(str(ROOT / "recipes" / "llama70b_fp8kv_llmapi.yaml")) and said in note
    assert "Next: point model.source at the checkpoint folder that holds config.json" in note
    assert note.endswith("planned from the recipe's model fields alone.")
    # calibrate refuses the folder (no config.json); its dry run now fails with the same words (a source shaped like a
    # hub id, org/name, gets them as a note, as an uncached hub id does)
    assert main(["calibrate", *args[1:], "--dry-run"]) != 0
    assert said in " ".join(capsys.readouterr().err.split())
    shutil.copy(ROOT / "tests" / "data" / "configs" / "llama3_3_70b" / "config.json", folder)
    recipe = load_recipe("llama70b_fp8kv_llmapi", ["model.source=models/llama3/tokenizer-only"])
    assert resolve_architecture(recipe).source == f"model config {folder.resolve() / 'config.json'}"
    assert main([*args, "--json"]) == 0
    assert "holds no config.json" not in capsys.readouterr().out
