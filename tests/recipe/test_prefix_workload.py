"""bench.prefix, the prefix-sharing workload (#55): declared once with bounds and descriptions, the shared prefix
inside the first prompt and the longest session within the served lengths, each refusal naming the keys, the figure
and the limit."""

from __future__ import annotations

import pytest

from trtkv.core.errors import RecipeError
from trtkv.recipe import load_recipe
from trtkv.recipe.bench_section import PrefixWorkload
from trtkv.recipe.reference import reference_markdown


def problems(overrides: list[str]) -> list[str]:
    with pytest.raises(RecipeError) as info:
        load_recipe("smollm2_fp8kv", overrides)
    return [line for line in str(info.value).splitlines() if line.strip().startswith("- ")]


def test_defaults_send_no_prefix_workload() -> None:
    p = load_recipe("smollm2_fp8kv").bench.prefix
    assert (p.shared_tokens, p.groups, p.turns, p.turn_tokens, p.think_time_s) == (0, 1, 1, 64, 0.0)
    assert not p.enabled


def test_a_workload_within_the_limits_loads() -> None:
    r = load_recipe("smollm2_fp8kv", ["bench.input_tokens=128", "bench.prefix.shared_tokens=96", "bench.prefix.groups=3",
                                      "bench.prefix.turns=3", "bench.prefix.turn_tokens=16",
                                      "bench.prefix.think_time_s=0.5"])
    p = r.bench.prefix
    assert p.enabled and (p.shared_tokens, p.groups, p.turns, p.turn_tokens, p.think_time_s) == (96, 3, 3, 16, 0.5)
    # 128 in + 2 x (16 + 32) + 32 out
    assert p.longest_tokens(r.bench.input_tokens, r.bench.output_tokens) == 128 + 2 * 48 + 32


def test_shared_prefix_longer_than_the_prompt_is_refused() -> None:
    (line,) = problems(["bench.input_tokens=64", "bench.prefix.shared_tokens=65"])
    assert "bench.prefix.shared_tokens:" in line and "65 exceeds bench.input_tokens 64" in line, line


def test_a_session_over_max_seq_len_is_refused_with_the_figure_and_the_limit() -> None:
    max_seq_len = load_recipe("smollm2_fp8kv").build.max_seq_len
    turns = max_seq_len // (64 + 32) + 2
    (line,) = problems(["bench.input_tokens=128", f"bench.prefix.turns={turns}"])
    longest = 128 + (turns - 1) * (64 + 32) + 32
    assert "bench.prefix.turns:" in line and f"= {longest} tokens" in line, line
    assert f"build.max_seq_len {max_seq_len}" in line and "turn_tokens 64" in line, line


def test_a_last_prompt_over_max_input_len_is_refused() -> None:
    base = ["build.max_input_len=200", "bench.input_tokens=128", "bench.tasks=[quiz]"]
    assert load_recipe("smollm2_fp8kv", base).build.max_input_len == 200
    (line,) = problems([*base, "bench.prefix.turns=2", "bench.prefix.turn_tokens=64"])
    assert "bench.prefix.turns:" in line and "build.max_input_len 200" in line and "224 tokens" in line, line


@pytest.mark.parametrize(("override", "bound"), [
    ("bench.prefix.shared_tokens=-1", "greater than or equal to 0"),
    ("bench.prefix.groups=0", "greater than or equal to 1"),
    ("bench.prefix.turns=0", "greater than or equal to 1"),
    ("bench.prefix.turn_tokens=0", "greater than or equal to 1"),
    ("bench.prefix.think_time_s=-0.5", "greater than or equal to 0"),
    ("bench.prefix.thinking=1", "unknown key"),
])
def test_out_of_range_values_are_refused_naming_the_key(override: str, bound: str) -> None:
    (line,) = problems([override])
    assert override.split("=")[0] + ":" in line and bound in line, line


def test_every_key_is_described_and_in_the_recipe_reference() -> None:
    reference = reference_markdown()
    for name, info in PrefixWorkload.model_fields.items():
        assert info.description, name
        assert f"| `bench.prefix.{name}` |" in reference, name
    assert "holds its concurrency slot" in str(PrefixWorkload.model_fields["think_time_s"].description)
