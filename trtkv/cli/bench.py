"""`trtkv bench`: latency/throughput sweep and accuracy tasks against a served recipe (Triton gRPC/HTTP or any
OpenAI-compatible server), checked against SLOs."""

from __future__ import annotations

import argparse

from trtkv.bench.options import BenchOptions
from trtkv.cli.common import add_recipe_args, load, subparser

EXAMPLES = """\
  $ trtkv bench smollm2_fp8kv
  $ trtkv bench smollm2_fp8kv --url 127.0.0.1:8001 --slo time_to_first_token.p99<=500 --slo quiz.accuracy>=0.3
  $ trtkv bench smollm2_fp8kv --protocol http --tasks none bench.concurrency=[1,2,4] bench.num_requests=32
  $ trtkv bench llama70b_fp8kv --url gpu-host:8001
  $ trtkv bench smollm2_fp8kv_vllm --protocol openai --url 127.0.0.1:8000 --model smollm2_fp8kv_vllm

exit codes: 0 all SLOs met, 1 an SLO failed (table printed), 2 usage/endpoint error, 130 interrupted (partial
results written). URL: --url, else engines/<recipe>/serve/server.json, else the recipe's triton host and port.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = subparser(sub, "bench", EXAMPLES)
    add_recipe_args(p)
    BenchOptions.add_arguments(p)  # every flag, its type, default and help: one field each (trtkv.bench.options)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trtkv.bench.runner import run_bench

    opts = BenchOptions.from_args(args)  # before the recipe: a bad flag is named first
    return run_bench(load(args), opts).exit_code
