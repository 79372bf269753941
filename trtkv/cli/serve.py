"""`trtkv serve`: start Triton for a recipe (bundled tritonserver on CPU; container / mpirun on GPUs)."""

from __future__ import annotations

import argparse

from trtkv.cli.common import add_recipe_args, load, subparser

EXAMPLES = """\
  $ trtkv serve smollm2_fp8kv                         # CPU: bundled tritonserver, returns once ready
  $ trtkv serve smollm2_fp8kv triton.http_port=9000 triton.grpc_port=9001 triton.metrics_port=9002
  $ trtkv serve llama70b_fp8kv --dry-run              # print the docker / mpirun commands
  $ trtkv serve llama70b_fp8kv_llmapi --trtllm-serve --dry-run   # TensorRT-LLM's OpenAI-compatible server
  $ trtkv stop smollm2_fp8kv
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = subparser(sub, "serve", "Start tritonserver for a recipe and wait until it is ready", EXAMPLES)
    add_recipe_args(p)
    p.add_argument("--dry-run", action="store_true", help="print the server command(s) and exit")
    p.add_argument("--trtllm-serve", action="store_true",
                   help="serve with trtllm-serve (OpenAI-compatible, /v1/completions) instead of Triton: build.backend "
                        "llmapi on GPUs, in the container; uses the build's llm_api_options.yaml as --config")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds to wait for readiness (default: recipe triton.startup_timeout_s)")
    p.add_argument("--no-supervise", action="store_true",
                   help="no supervisor: nothing probes the server or restarts it when an instance dies")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trtkv import serve

    recipe = load(args)
    info = serve.start(recipe, dry_run=args.dry_run, timeout_s=args.timeout, trtllm_serve=args.trtllm_serve)
    if info is not None and not args.no_supervise and not args.trtllm_serve:
        from trtkv import supervise

        try:
            supervise.spawn(recipe, [args.recipe, *args.overrides])
        except BaseException:
            serve.stop(recipe)  # no half-started state: the server goes with its supervisor
            raise
    return 0
