"""The text `trtkv init` writes (trtkv.checkpoints.render) and the check that settles it (trtkv.recipe.settle), without the
CLI or the planner: every family's text validates for its engine, untrusted text stays inside its comment, TP/PP
split the heads, and a default the engine refuses moves with the reason in a comment."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtkv.checkpoints import count_parameters, read_model_facts, stored_weight_bytes
from trtkv.checkpoints.render import DECODERS, comment_line, render, split
from trtkv.core.errors import RecipeError
from trtkv.recipe.plain_yaml import load_yaml
from trtkv.recipe.settle import Settings, refusal, settle

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
FAMILIES = sorted(p.name for p in CONFIGS.iterdir() if (p / "config.json").is_file())


def draw(family: str, settings: Settings) -> str:
    facts = read_model_facts(CONFIGS / family)
    params = count_parameters(facts)
    return render(family, facts, CONFIGS / family, settings, params=params,
                  stored=stored_weight_bytes(facts, params, 2.0))


def h100(backend: str = "llmapi", weights: str = "none", count: int = 8) -> Settings:
    return Settings("H100-80GB", count, "fp8", weights, backend, 4096, 4)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_renders_a_recipe_its_engine_accepts(tmp_path: Path, family: str) -> None:
    text, recipe = settle(family, tmp_path / f"{family}.yaml", h100(), {}, lambda s: draw(family, s))
    data = load_yaml(text)
    assert list(data) == ["description", "model", "quantization", "build", "hardware", "calibration", "bench", "probe"]
    assert recipe.build.tp_size * recipe.build.pp_size == recipe.hardware.count == 8
    facts = read_model_facts(CONFIGS / family)
    assert data["model"]["architecture"] == DECODERS.get(facts.model_type, facts.model_type)
    assert all(line.isascii() for line in text.splitlines())


def test_untrusted_text_cannot_end_its_comment() -> None:
    line = comment_line("# from /m\ntriton:\n  host: 0.0.0.0\u2028x\u0085y")
    assert "\n" not in line and line.isascii() and line.isprintable()
    assert line == "# from /m\\ntriton:\\n  host: 0.0.0.0\\u2028x\\u0085y"
    assert comment_line("# plain") == "# plain"


def test_tp_splits_the_heads_and_pp_takes_the_rest() -> None:
    llama = read_model_facts(CONFIGS / "llama3_1_8b")  # 32 heads, 8 KV heads
    assert split(llama, 1) == (1, 1) and split(llama, 8) == (8, 1) and split(llama, 16) == (8, 2)


def test_a_refused_default_moves_and_a_refused_flag_is_named(tmp_path: Path) -> None:
    """gpt-oss's MXFP4 weights on vLLM: no KV scale is read beside them, so init's default fp8 KV moves to fp8_cast
    (the weights stay as stored: on main they moved to fp8); the same KV format asked for is refused, named."""
    out = tmp_path / "v.yaml"
    text, recipe = settle("v", out, h100("vllm", count=2), {}, lambda s: draw("gpt_oss_120b", s))
    assert recipe.quantization.weights.value == "none" and recipe.quantization.kv_cache.value == "fp8_cast"
    assert "kv_cache: fp8_cast   # fp8_cast, not fp8:" in text and "checkpoint_quant: \"mxfp4\"" in text
    with pytest.raises(RecipeError, match=r"v\.yaml: quantization\.kv_cache \(from --kv-cache fp8\).*fp8_cast"):
        settle("v", out, h100("vllm", count=2), {"--kv-cache": "fp8"}, lambda s: draw("gpt_oss_120b", s))
    assert "trtkv init's default; choose it with --count" in str(refusal(out, [("hardware.count", "x")], {}))
