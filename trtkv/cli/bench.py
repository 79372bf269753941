"""`trtkv bench`: latency/throughput sweep and accuracy tasks against a served recipe (Triton
gRPC/HTTP or any OpenAI-compatible server), checked against SLOs."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from trtkv.bench.options import BenchOptions
from trtkv.cli.common import add_verb, load

if TYPE_CHECKING:
    from trtkv.bench import ServedSide
    from trtkv.contracts import PrefixPrediction
    from trtkv.recipe import Recipe

EXAMPLES = """\
  $ trtkv bench smollm2_fp8kv
  $ trtkv bench smollm2_fp8kv --url 127.0.0.1:8001 --slo time_to_first_token.p99<=500 --slo quiz.accuracy>=0.3
  $ trtkv bench smollm2_fp8kv --protocol http --tasks none bench.concurrency=[1,2,4] bench.num_requests=32
  $ trtkv bench llama70b_fp8kv --url gpu-host:8001
  $ trtkv bench smollm2_fp8kv_vllm --protocol openai --url 127.0.0.1:8000 --model smollm2_fp8kv_vllm
  $ trtkv bench smollm2_fp8kv --tasks none --sweep-input 128,512,1024 "bench.concurrency=[1]"

exit codes: 0 all SLOs met, 1 an SLO failed (table printed), 2 usage/endpoint error, 130 interrupted (partial
results written to <output>.partial/; the last complete run's results are kept). URL: --url, else engines/<recipe>/serve/server.json, else the recipe's triton host and port.
"""  # noqa: E501


def add_parser(sub: argparse._SubParsersAction) -> None:
    # every flag, its type, default and help: one field each (trtkv.bench.options)
    add_verb(sub, "bench", EXAMPLES, BenchOptions, run)


def run(args: argparse.Namespace) -> int:
    from trtkv.bench.runner import run_bench

    opts = BenchOptions.from_args(args)  # before the recipe: a bad flag is named first
    recipe = load(args)
    if opts.sweep_input is not None:
        opts = opts.model_copy(update={"sweep_input": sweep_lengths(opts.sweep_input, recipe)})
    return run_bench(recipe, opts, served_side()).exit_code


def served_side() -> ServedSide:
    """The serving stage's part in a benchmark: its supervisor's quiet request, the served KV
    pool against the plan and the plan's predicted prefix-cache hit rates (the bench stage imports
    neither serving nor the planner)."""
    from trtkv.bench import ServedSide
    from trtkv.plan import figures
    from trtkv.serving import pool, supervise

    def kv_pool(recipe: Recipe, url: str | None) -> dict[str, Any]:
        return pool.compare_at(recipe, url, figures(recipe))

    def prefix_plan(recipe: Recipe) -> PrefixPrediction | None:
        return figures(recipe).prefix

    return ServedSide(quiet=supervise.quiet, kv_pool=kv_pool, prefix_plan=prefix_plan)


def sweep_lengths(lengths: list[int], recipe: Recipe) -> list[int]:
    """--sweep-input: positive lengths the recipe's engine accepts (build.max_input_len and
    max_seq_len), all checked at once; sorted, each once."""
    from trtkv.core.errors import TrtkvError
    from trtkv.recipe.bench_section import MAX_SWEEP_LENGTHS

    given = ",".join(map(str, lengths))
    bad = [n for n in lengths if n <= 0]
    if not lengths or bad:
        raise TrtkvError(
            f"--sweep-input {given!r}: expected positive token counts separated by commas, e.g. "
            f"128,512,2048{f' (not {bad[0]})' if bad else ''}."
        )
    out = sorted(set(lengths))
    if len(out) > MAX_SWEEP_LENGTHS:
        raise TrtkvError(
            f"--sweep-input: {len(out)} lengths; at most {MAX_SWEEP_LENGTHS} (each one runs every "
            "latency level once, as bench.sweep_input_tokens allows). Next: fewer lengths."
        )
    b = recipe.build
    over = [n for n in out if n > b.max_input_len or n + recipe.bench.output_tokens > b.max_seq_len]
    if over:
        raise TrtkvError(
            f"--sweep-input {given!r}: {', '.join(map(str, over))} exceed(s) build.max_input_len "
            f"{b.max_input_len} (or, with bench.output_tokens {recipe.bench.output_tokens}, "
            f"build.max_seq_len {b.max_seq_len}) of recipe {recipe.name}. Next: shorter lengths, "
            "or raise those fields."
        )
    return out
