"""A model's config.json is untrusted text (issue 42, item 3): read as a bounded regular file, parsed strictly, every
number within trtkv.recipe.limits' ranges, every word an identifier, and nothing from it can become recipe keys; each
refusal is a "Model config not readable" error naming the field. A hypothesis fuzz test over mutated configs, bounded
like the recipe loader's (tests/recipe/test_fuzz.py)."""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from trtkv.checkpoints import read_model_facts
from trtkv.checkpoints.hf_config_fields import ModelConfigError
from trtkv.cli import init
from trtkv.core.errors import RecipeError
from trtkv.plan.planner import plan
from trtkv.recipe import Recipe, load_recipe
from trtkv.recipe.limits import CONFIG_FIELDS, RANGES

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
LLAMA = json.loads((CONFIGS / "llama3_1_8b" / "config.json").read_text())


def _within(seconds: float, work: Any) -> Any:
    """Run `work()` in a daemon thread: its result or exception, or a failure when it does not end in time."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(("ok", work()))
        except BaseException as exc:  # noqa: BLE001 - the outcome is what the test checks
            out.append(("raised", exc))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert out, f"did not end within {seconds} s"
    return out[0]


def test_a_fifo_or_a_device_is_refused_at_once(tmp_path: Path) -> None:
    """Before: a FIFO hung init; a symlink to /dev/zero was read until MemoryError (the size check used stat)."""
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "config.json")
    zero = tmp_path / "zero"
    zero.mkdir()
    (zero / "config.json").symlink_to("/dev/zero")
    for folder, words in ((fifo, "a FIFO, not a regular file"), (zero, "a character device, not a regular file")):
        kind, result = _within(10, lambda f=folder: read_model_facts(f))
        assert kind == "raised" and isinstance(result, ModelConfigError), result
        assert words in str(result) and "Model config not readable" in str(result)


BAD = {
    "nan_heads": ('"num_attention_heads": NaN', "not readable JSON (NaN is not JSON"),
    "infinity": ('"num_key_value_heads": Infinity', "not readable JSON (Infinity is not JSON"),
    "string_heads": ('"num_attention_heads": "32"', "num_attention_heads: '32' is not an integer"),
    "float_layers": ('"num_hidden_layers": 1e9', "num_hidden_layers: 1000000000.0 is not an integer"),
    "huge_layers": ('"num_hidden_layers": 1000000000', "num_hidden_layers: 1000000000 is outside 1..1,024"),
    "digits": ('"vocab_size": ' + "9" * 5000, "a number of 5000 characters"),
    "deep": ('"rope_scaling": ' + "[" * 5000 + "]" * 5000, "nested deeper than 64 levels"),
    "archs_string": ('"architectures": "LlamaForCausalLM"', "architectures: 'LlamaForCausalLM' is not a list"),
    "empty_window": ('"sliding_window": [], "use_sliding_window": true', "sliding_window: an empty list"),
    "window_words": ('"sliding_window": ["4096"]', "sliding_window[0]: '4096' is not an integer"),
    "layer_types_dict": ('"layer_types": {"0": "full_attention"}', "layer_types: {'0': 'full_attention'} is not a list"),
    "quant_string": ('"quantization_config": "fp8"', "quantization_config: 'fp8' is not an object"),
    "bool_heads": ('"num_attention_heads": true', "num_attention_heads: True is not an integer"),
    "tiny_head": ('"hidden_size": 8, "head_dim": null', "below one channel per head"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_malformed_shapes_are_named_not_tracebacks(tmp_path: Path, name: str) -> None:
    """Before: NaN/Infinity/strings in head counts, a non-list `architectures`, 5000-digit numbers, deep nesting and
    `sliding_window: []` gave TypeError, ValueError, RecursionError or ZeroDivisionError tracebacks."""
    field, words = BAD[name]
    text = json.dumps(LLAMA)[:-1] + ", " + field + "}"
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ModelConfigError) as info:
        read_model_facts(tmp_path)
    message = str(info.value)
    assert message.startswith("Model config not readable") and words in message, message
    assert "Next:" in message


@pytest.mark.parametrize("field", ["architectures", "model_type", "torch_dtype"])
def test_config_text_never_becomes_recipe_keys(tmp_path: Path, field: str) -> None:
    """Before: `architectures: ["X\\ntriton:\\n  host: 0.0.0.0\\n#"]` wrote a real `triton.host` into the recipe."""
    hostile = "X\ntriton:\n  host: 0.0.0.0\n#"
    config = {**LLAMA, field: [hostile] if field == "architectures" else hostile}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(RecipeError, match=f"(?s)Model config not readable.*{field}.*is not a"):
        init.write_recipe("inj", tmp_path, tmp_path / "inj.yaml")
    assert not (tmp_path / "inj.yaml").exists()


def test_a_path_with_line_breaks_stays_inside_its_comment(tmp_path: Path) -> None:
    folder = tmp_path / "m\ntriton:\n  host: 0.0.0.0\n#\u2028x"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA))
    out = init.write_recipe("safe", folder, tmp_path / "safe.yaml")
    recipe = load_recipe(out)
    assert recipe.triton.host == "127.0.0.1" and Path(recipe.model.source) == folder
    assert all(line.isascii() for line in out.read_text().splitlines())


def test_two_inits_of_one_output_never_both_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: two concurrent `trtkv init` of one output without --force both said "wrote" and one silently
    replaced the other. Here the other run writes the file between this run's check and its write."""
    out = tmp_path / "race.yaml"
    real = init._fits

    def meanwhile(recipe: Recipe) -> tuple[int, str]:
        if not out.exists():
            out.write_text("# the other run's recipe\n")
        return real(recipe)

    monkeypatch.setattr(init, "_fits", meanwhile)
    with pytest.raises(RecipeError, match="already exists"):
        init.write_recipe("race", CONFIGS / "qwen3_8b", out)
    assert out.read_text() == "# the other run's recipe\n"
    assert not list(tmp_path.glob(".race.yaml.tmp-*"))


def test_count_zero_is_refused_not_taken_as_automatic(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"--count 0: .*1\.\.65,536"):
        init.write_recipe("zero", CONFIGS / "qwen3_8b", tmp_path / "zero.yaml", count=0)
    assert not (tmp_path / "zero.yaml").exists()


def test_recipe_values_are_bounded_by_the_same_ranges() -> None:
    """Before: `hardware.memory_gib=1e309` (infinity) crashed the planner and `model.num_layers=10000000` did not
    finish; both are recipe errors naming the range now, and the largest allowed model plans in seconds."""
    for override, words in (("hardware.memory_gib=1e309", "hardware.memory_gib: Input should be a finite number"),
                            ("model.num_layers=10000000", "allowed: 1..1,024 (the largest published: Llama-3.1-405B"),
                            ("triton.startup_timeout_s=1e12", "triton.startup_timeout_s"),
                            ("hardware.memory_gib=nan", "hardware.memory_gib")):
        with pytest.raises(RecipeError, match=words.replace("(", r"\(").replace(".", r"\.")):
            load_recipe("llama70b_fp8kv", [override])
    start = time.monotonic()
    plan(load_recipe("llama70b_fp8kv", [f"model.num_layers={int(RANGES['layers'].high)}"]))
    assert time.monotonic() - start < 20


def test_every_shipped_config_is_within_the_ranges() -> None:
    """The ranges admit every config kept as test data (published models, largest first: DeepSeek-V3, Kimi K2)."""
    for config in CONFIGS.rglob("config.json"):
        if "refused" not in config.parts:
            read_model_facts(config)
    assert {"num_hidden_layers", "num_attention_heads", "vocab_size", "max_position_embeddings"} <= set(CONFIG_FIELDS)


FUZZ = settings(max_examples=300, deadline=timedelta(milliseconds=1000), database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                   st.text(max_size=20), st.lists(st.integers(-5, 5000), max_size=5),
                   st.dictionaries(st.text(max_size=5), st.integers(), max_size=3))
KEYS = st.sampled_from(sorted({*CONFIG_FIELDS, "architectures", "model_type", "layer_types", "text_config",
                               "quantization_config", "use_sliding_window", "torch_dtype", "no_rope_layers"}))


@FUZZ
@given(changes=st.dictionaries(KEYS, VALUES, max_size=6), junk=st.binary(max_size=8), cut=st.integers(0, 400))
@example(changes={"sliding_window": []}, junk=b"", cut=0)
@example(changes={"num_hidden_layers": 2**62}, junk=b"", cut=0)
def test_fuzz_the_config_reader_gives_facts_or_a_named_refusal(tmp_path: Path, changes: dict[str, Any], junk: bytes,
                                                               cut: int) -> None:
    text = json.dumps({**LLAMA, **changes}, allow_nan=True).encode()
    if junk:
        text = text[:cut] + junk + text[cut:]
    (tmp_path / "config.json").write_bytes(text)
    kind, result = _within(5, lambda: read_model_facts(tmp_path))
    if kind == "raised":
        assert isinstance(result, ModelConfigError), repr(result)
        assert result.problems and all("Next:" in p for p in result.problems)
    else:
        assert 1 <= result.num_layers <= RANGES["layers"].high and len(result.layers) == result.num_layers


def test_recipe_words_that_land_in_commands_are_names_and_lines_are_lines() -> None:
    """The recipe's own text fields under the same rule as the config's words (what init writes passes them)."""
    for override, words in (('model.architecture="llama; rm -rf /"', "model.architecture: must be a model family"),
                            ('description="a\\nb"', "description: must be one line"),
                            ('model.attention_source="x\\ny"', "model.attention_source: must be one line")):
        with pytest.raises(RecipeError, match=words):
            load_recipe("smollm2_fp8kv", [override])
