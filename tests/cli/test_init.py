"""`trtkv init`: a recipe from a config.json that validates and plans at once, for each family; refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtkv.checkpoints import compact_layers, read_model_facts
from trtkv.cli.init import write_recipe
from trtkv.core.errors import RecipeError
from trtkv.plan.planner import plan
from trtkv.recipe import load_recipe

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
FAMILIES = sorted(p.name for p in CONFIGS.iterdir() if (p / "config.json").is_file())


@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip(tmp_path: Path, family: str) -> None:
    out = write_recipe(f"r_{family}", CONFIGS / family, tmp_path / f"r_{family}.yaml")
    text = out.read_text()
    assert text.startswith(f"# trtkv plan r_{family}")
    recipe = load_recipe(out)  # validates
    facts = read_model_facts(CONFIGS / family)
    assert recipe.model.attention_layers == compact_layers(facts.layers)
    assert recipe.model.attention_source and facts.attention_source in recipe.model.attention_source
    p = plan(recipe)  # plans at once, the config on disk agreeing with every written field
    cap = next(c for c in p.formats if c.format == p.recipe_kv_format)
    assert cap.max_sequences[recipe.build.max_seq_len] >= 1  # TP/PP sized so one sequence fits
    assert recipe.build.tp_size * recipe.build.pp_size == recipe.hardware.count
    if facts.max_position_embeddings:
        assert recipe.build.max_seq_len <= facts.max_position_embeddings


def test_sizes_tp_pp_for_the_gpus(tmp_path: Path) -> None:
    small = load_recipe(write_recipe("a", CONFIGS / "llama3_1_8b", tmp_path / "a.yaml"))
    assert (small.build.tp_size, small.build.pp_size) == (1, 1)
    big = load_recipe(write_recipe("b", CONFIGS / "deepseek_v3", tmp_path / "b.yaml"))
    assert big.hardware.count > 8 and big.build.tp_size == 8  # 627 GiB of FP8 weights: more than one node of H100s
    fixed = load_recipe(write_recipe("c", CONFIGS / "deepseek_v3", tmp_path / "c.yaml", "H200-141GB", 8))
    assert (fixed.build.tp_size, fixed.hardware.count) == (8, 8)
    cpu = load_recipe(write_recipe("d", CONFIGS / "llama3_1_8b", tmp_path / "d.yaml", "cpu"))
    assert cpu.build.backend.value == "reference" and cpu.hardware.count == 1
    vllm = load_recipe(write_recipe("e", CONFIGS / "gemma3_27b", tmp_path / "e.yaml", "cpu"))
    assert vllm.build.backend.value == "vllm"


def test_never_overwrites_without_force(tmp_path: Path) -> None:
    out = write_recipe("x", CONFIGS / "qwen3_8b", tmp_path / "x.yaml")
    out.write_text("# mine\n" + out.read_text())
    with pytest.raises(RecipeError, match="already exists.*--force"):
        write_recipe("x", CONFIGS / "qwen3_8b", tmp_path / "x.yaml")
    assert out.read_text().startswith("# mine")
    write_recipe("x", CONFIGS / "qwen3_8b", tmp_path / "x.yaml", force=True)
    assert not out.read_text().startswith("# mine")


@pytest.mark.parametrize("name", ["Bad Name", "UPPER", "a/b", "-lead", "x" * 60])
def test_refuses_a_bad_name_before_writing(tmp_path: Path, name: str) -> None:
    with pytest.raises(RecipeError):
        write_recipe(name, CONFIGS / "qwen3_8b", tmp_path / f"{name.replace('/', '_')}.yaml")
    assert list(tmp_path.iterdir()) == []


def test_refuses_unreadable_and_unpriced_configs(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="qwen3_next.*needs.*linear_num_key_heads.*Next:"):
        write_recipe("q", CONFIGS / "refused" / "qwen3_next", tmp_path / "q.yaml")
    with pytest.raises(RecipeError, match="Mamba-2 .*state-space only.*Next:"):
        write_recipe("q", CONFIGS / "refused" / "mamba2", tmp_path / "q.yaml")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"num_hidden_layers": 2, "hidden_size": 64}')
    with pytest.raises(RecipeError, match=r"num_attention_heads: missing.*Next:"):
        write_recipe("m", tmp_path / "m", tmp_path / "m.yaml")
    assert not (tmp_path / "m.yaml").exists() and not (tmp_path / "q.yaml").exists()


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trtkv.cli import main

    out = tmp_path / "gemma.yaml"
    assert main(["init", "gemma", "--model", str(CONFIGS / "gemma3_27b" / "config.json"), "--output", str(out),
                 "--gpu", "H200-141GB", "--kv-cache", "fp8", "--backend", "vllm"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert main(["plan", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "52 x sliding:1024 + 10 x full" in printed and "vLLM allocation" in printed
    assert main(["init", "gemma", "--model", str(CONFIGS / "gemma3_27b"), "--output", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
