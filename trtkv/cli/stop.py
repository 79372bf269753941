"""`trtkv stop`: not built yet (placeholder until its issue lands)."""

from __future__ import annotations

import argparse

from trtkv.cli.common import add_recipe_args, subparser


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = subparser(sub, "stop", "stop stage (not built yet)", "  $ trtkv stop smollm2_fp8kv\n")
    add_recipe_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print("trtkv stop: not built yet")
    return 3
