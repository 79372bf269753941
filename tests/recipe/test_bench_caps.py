"""Every loop a user's bench value drives has a cap that validation states (issue 48): 3,000 concurrency levels kept
`plan --estimate` busy for hours, a level of a million streams asked for a million client threads. Each over-cap value
is one problem naming the field and its cap, and the field's description states the cap."""

from __future__ import annotations

import pytest

from trtkv.core.errors import RecipeError
from trtkv.recipe import load_recipe
from trtkv.recipe.bench_section import MAX_CONCURRENCY, MAX_LEVELS, MAX_TASK_LENGTHS, MAX_THRESHOLDS, BenchConfig


def _many(n: int, value: str = "16") -> str:
    return "[" + ",".join([value] * n) + "]"


@pytest.mark.parametrize(("override", "field", "cap"), [
    (f"bench.concurrency={_many(3000, '1')}", "bench.concurrency", f"at most {MAX_LEVELS} items"),
    (f"bench.concurrency=[1,{MAX_CONCURRENCY + 1}]", "bench.concurrency", f"at most {MAX_CONCURRENCY} per level"),
    (f"bench.needle_context_lengths={_many(MAX_TASK_LENGTHS + 1)}", "bench.needle_context_lengths",
     f"at most {MAX_TASK_LENGTHS} items"),
    (f"bench.ruler_lengths={_many(MAX_TASK_LENGTHS + 1)}", "bench.ruler_lengths", f"at most {MAX_TASK_LENGTHS} items"),
    (f"bench.fidelity_lengths={_many(MAX_TASK_LENGTHS + 1)}", "bench.fidelity_lengths",
     f"at most {MAX_TASK_LENGTHS} items"),
    (f"bench.thresholds={_many(MAX_THRESHOLDS + 1, 'request_errors.failed<=0')}", "bench.thresholds",
     f"at most {MAX_THRESHOLDS} items"),
])
def test_an_over_cap_bench_value_is_one_problem_naming_the_field_and_cap(override: str, field: str, cap: str) -> None:
    with pytest.raises(RecipeError) as info:
        load_recipe("smollm2_fp8kv", [override])
    problems = [line for line in str(info.value).splitlines() if line.strip().startswith("- ")]
    assert len(problems) == 1 and f"{field}:" in problems[0] and cap in problems[0], str(info.value)


def test_the_caps_are_in_the_field_descriptions() -> None:
    fields = BenchConfig.model_fields
    assert f"at most {MAX_LEVELS} levels" in str(fields["concurrency"].description)
    assert f"{MAX_CONCURRENCY} streams" in str(fields["concurrency"].description)
    for name in ("needle_context_lengths", "ruler_lengths", "fidelity_lengths"):
        assert f"at most {MAX_TASK_LENGTHS}" in str(fields[name].description), name
    assert f"at most {MAX_THRESHOLDS}" in str(fields["thresholds"].description)


def test_the_caps_admit_their_limit() -> None:
    recipe = load_recipe("smollm2_fp8kv", [f"bench.concurrency={_many(MAX_LEVELS, '1')}"])
    assert len(recipe.bench.concurrency) == MAX_LEVELS
    assert load_recipe("smollm2_fp8kv", [f"bench.concurrency=[{MAX_CONCURRENCY}]"]).bench.concurrency == [MAX_CONCURRENCY]
