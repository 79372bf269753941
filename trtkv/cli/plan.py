"""`trtkv plan`: KV bytes per token, capacity on the recipe's GPUs, decode bandwidth bound, advice."""

from __future__ import annotations

import argparse
from pathlib import Path

from trtkv.cli.common import add_recipe_args, load, subparser


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = subparser(sub, "plan", "plan KV-cache memory and capacity for a recipe",
                  "  $ trtkv plan llama70b_fp8kv\n  $ trtkv plan llama70b_fp8kv --json\n"
                  "  $ trtkv plan llama70b_fp8kv hardware.gpu=H200-141GB build.max_seq_len=131072\n")
    add_recipe_args(p)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--probe-dir", type=Path, default=None, help="probe results to base advice on "
                   "(default engines/<recipe>/probe)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trtkv.memory import format_plan, plan

    result = plan(load(args), args.probe_dir)
    print(result.to_json() if args.json else format_plan(result))
    return 0
