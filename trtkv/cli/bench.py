"""`trtkv bench`: latency/throughput sweep and accuracy tasks against a served recipe (Triton gRPC/HTTP or any
OpenAI-compatible server), checked against SLOs."""

from __future__ import annotations

import argparse
from pathlib import Path

from trtkv.cli.common import add_recipe_args, load, subparser

EXAMPLES = """\
  $ trtkv bench smollm2_fp8kv
  $ trtkv bench smollm2_fp8kv --url 127.0.0.1:8001 --slo time_to_first_token.p99<=500 --slo quiz.accuracy>=0.3
  $ trtkv bench smollm2_fp8kv --protocol http --tasks none bench.concurrency=[1,2,4] bench.num_requests=32
  $ trtkv bench llama70b_fp8kv --url gpu-host:8001
  $ trtkv bench smollm2_fp8kv_vllm --protocol openai --url 127.0.0.1:8000 --model smollm2_fp8kv_vllm
  $ trtkv bench llama70b_fp8kv --protocol openai --url lb-host:8000 bench.concurrency=[256,1024] --workers 4

exit codes: 0 all SLOs met, 1 an SLO failed (table printed), 2 usage/endpoint error, 130 interrupted (partial
results written). URL: --url, else engines/<recipe>/serve/server.json, else the recipe's triton host and port.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    from trtkv.contracts.interface import INTERFACES
    from trtkv.recipe import Protocol

    openai = Protocol.OPENAI.value
    models = ", ".join(f"{i.model} for the {i.layout} layout" for i in INTERFACES.values())
    p = subparser(sub, "bench", EXAMPLES)
    add_recipe_args(p)
    p.add_argument("--url", help=f"HOST:PORT of the server (its gRPC port, or its HTTP port with --protocol http or "
                                 f"{openai})")
    p.add_argument("--protocol", choices=[proto.value for proto in Protocol],
                   help="Triton's gRPC streaming (default: the recipe's bench.protocol), Triton's HTTP generate_stream "
                        "(SSE), or the streaming /v1/completions of any OpenAI-compatible server (vLLM, trtllm-serve, "
                        "Triton's OpenAI frontend; --url HOST:PORT of its HTTP port)")
    p.add_argument("--endpoint-type", choices=["completions", "chat"], default="completions",
                   help=f"with --protocol {openai}: /v1/completions (default) or /v1/chat/completions")
    p.add_argument("--model", help=f"model name on the server (default: the one the server lists with --protocol "
                                   f"{openai}; else {models})")
    p.add_argument("--slo", action="append", default=[], metavar="METRIC.STAT<=VALUE",
                   help="an SLO on top of the recipe's bench.thresholds, e.g. time_to_first_token.p99<=500, "
                        "quiz.accuracy>=0.3, request_errors.failed<=0 (repeatable)")
    p.add_argument("--goodput", metavar="'TAG:VALUE ...'",
                   help="AIPerf's goodput: requests within every threshold per second, e.g. 'time_to_first_token:500 "
                        "inter_token_latency:100' (ms); in results.json and the AIPerf exports (aiperf/<level>/)")
    p.add_argument("--allow-failures", action="store_true",
                   help="do not fail the bench because requests failed (by default any failed request is an SLO "
                        "breach: request_errors.failed<=0, exit 1)")
    from trtkv.recipe.schema import BenchTask  # the task names, from the one enum the recipe validates against

    p.add_argument("--tasks", help=f"accuracy tasks, comma separated ({','.join(t.value for t in BenchTask)}) or `none` "
                                   "(default: the recipe's bench.tasks)")
    p.add_argument("--no-latency", action="store_true", help="skip the latency sweep (accuracy tasks only)")
    p.add_argument("--workers", default="auto", metavar="N|auto",
                   help="client processes for the latency sweep (default auto: one, unless a level's warm-up shows "
                        "one process would use more than half a core, then the streams are sharded over processes)")
    p.add_argument("--golden-prompts", type=int, default=8, help="prompts in the golden-agreement task (default 8)")
    p.add_argument("--output", type=Path, help="results folder (default: engines/<recipe>/bench)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trtkv.bench.runner import BenchOptions, run_bench
    from trtkv.core.errors import TrtkvError
    from trtkv.recipe import BenchTask

    tasks = None
    if args.tasks is not None:
        tasks = [t.strip() for t in args.tasks.split(",") if t.strip() and t.strip() != "none"]
        allowed = [t.value for t in BenchTask]
        bad = [t for t in tasks if t not in allowed]
        if bad:
            raise TrtkvError(f"--tasks {args.tasks!r}: unknown task {bad[0]!r}. Allowed: {', '.join(allowed)}, none.")
    if args.golden_prompts < 1:
        raise TrtkvError(f"--golden-prompts {args.golden_prompts}: must be >= 1.")
    workers = _workers(args.workers)
    recipe = load(args)
    opts = BenchOptions(url=args.url, protocol=args.protocol, model=args.model, slos=list(args.slo), tasks=tasks,
                        allow_failures=args.allow_failures, endpoint_type=args.endpoint_type, goodput=args.goodput,
                        latency=not args.no_latency, golden_prompts=args.golden_prompts, output=args.output,
                        progress=not args.no_progress, workers=workers)
    return run_bench(recipe, opts).exit_code


def _workers(text: str) -> int | None:
    """--workers: a count of client processes, or auto (None)."""
    from trtkv.core.errors import TrtkvError

    if text.strip().lower() == "auto":
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise TrtkvError(f"--workers {text!r}: expected a number of client processes >= 1, or auto.")
    return int(text)
