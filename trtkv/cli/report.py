"""`trtkv report`: one recipe's results (calibration, bench, probe, planner) as JSON and Markdown."""

from __future__ import annotations

import argparse

from trtkv.cli.common import add_recipe_args, load, subparser


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = subparser(sub, "report", "  $ trtkv report smollm2_fp8kv\n")
    add_recipe_args(p)
    p.add_argument("--quiet", action="store_true", help="write the files, print only where they are")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trtkv.report.summary import print_summary, write_report

    recipe = load(args)
    out = write_report(recipe)
    if not args.quiet:
        print_summary(recipe)
    print(f"report: {out / 'report.md'}")
    return 0
