"""`trtkv report`: one recipe's results (calibration, bench, probe, planner) as JSON and
Markdown."""

from __future__ import annotations

import argparse
from typing import Annotated

from pydantic import Field

from trtkv.cli.common import add_verb, load
from trtkv.core.options import Flag, Options


class ReportOptions(Options):
    """`trtkv report RECIPE [options]`: each field one flag (trtkv.core.options)."""

    quiet: Annotated[
        bool, Field(description="write the files, print only where they are"), Flag()
    ] = False


def add_parser(sub: argparse._SubParsersAction) -> None:
    add_verb(sub, "report", "  $ trtkv report smollm2_fp8kv\n", ReportOptions, run)


def run(args: argparse.Namespace) -> int:
    from trtkv.plan import figures
    from trtkv.report.summary import print_summary, write_report

    o = ReportOptions.from_args(args)
    recipe = load(args)
    planned = figures(recipe)
    out = write_report(recipe, planned)
    if not o.quiet:
        print_summary(recipe, planned)
    print(f"report: {out / 'report.md'}")
    return 0
