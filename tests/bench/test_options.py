"""`trtkv bench`'s options are BenchOptions' fields: the flags, their defaults and help come from the model, and what
the command line gives comes back as the model (issue #43: BenchOptions and the flags cannot drift)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from trtkv.bench.options import BenchOptions
from trtkv.cli import build_parser, main
from trtkv.core.errors import TrtkvError
from trtkv.recipe import BenchTask, Protocol


def bench_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["bench"]


def test_the_closed_sets_and_negative_flags_come_from_the_fields() -> None:
    """(The generic check of every verb's model: tests/cli/test_options.py.)"""
    actions = {a.dest: a for a in bench_parser()._actions}
    assert actions["protocol"].choices == [p.value for p in Protocol]
    assert actions["endpoint_type"].choices == ["completions", "chat"]
    assert actions["latency"].option_strings == ["--no-latency"] and actions["latency"].default is True
    assert actions["slos"].option_strings == ["--slo"] and actions["slos"].default == []


def test_no_flags_give_the_models_defaults() -> None:
    args = bench_parser().parse_args(["smollm2_fp8kv"])
    assert BenchOptions.from_args(args) == BenchOptions()


def test_the_command_line_comes_back_as_the_model(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[BenchOptions] = []

    def fake_run_bench(recipe: object, opts: BenchOptions, served: object) -> object:
        from trtkv.bench.runner import UNSERVED, ServedSide

        assert isinstance(served, ServedSide) and served is not UNSERVED  # `trtkv bench` lends the serving side
        seen.append(opts)
        return argparse.Namespace(exit_code=0)

    monkeypatch.setattr("trtkv.bench.runner.run_bench", fake_run_bench)
    assert main(["bench", "smollm2_fp8kv", "--protocol", "openai", "--tasks", "quiz, needle,none", "--no-latency",
                 "--slo", "quiz.accuracy>=0.3", "--slo", "time_to_first_token.p99<=500", "--golden-prompts", "3",
                 "--output", str(tmp_path), "--endpoint-type", "chat", "--no-progress", "bench.num_requests=2"]) == 0
    assert seen == [BenchOptions(protocol=Protocol.OPENAI, tasks=[BenchTask.QUIZ, BenchTask.NEEDLE], latency=False,
                                 slos=["quiz.accuracy>=0.3", "time_to_first_token.p99<=500"], golden_prompts=3,
                                 output=tmp_path, endpoint_type="chat", progress=False)]
    assert main(["bench", "smollm2_fp8kv", "--tasks", "none"]) == 0 and seen[-1].tasks == []


@pytest.mark.parametrize(("argv", "message"), [
    (["--golden-prompts", "0"], r"--golden-prompts 0: Input should be greater than or equal to 1"),
    (["--tasks", "quiz,quix"], r"--tasks 'quiz,quix': 'quix': Input should be 'quiz', 'golden', .* \(or none\)"),
])
def test_a_refused_value_names_its_flag(argv: list[str], message: str) -> None:
    args = bench_parser().parse_args(["smollm2_fp8kv", *argv])
    with pytest.raises(TrtkvError, match=message):
        BenchOptions.from_args(args)


def test_library_callers_get_the_same_validation() -> None:
    assert BenchOptions(protocol="http", tasks=["golden"]).protocol is Protocol.HTTP
    with pytest.raises(ValueError, match="protocol"):
        BenchOptions(protocol="smtp")
