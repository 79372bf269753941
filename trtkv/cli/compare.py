"""`trtkv compare`: the chain for several recipes one after another, then a side-by-side report."""

from __future__ import annotations

import argparse
from typing import Annotated

from pydantic import Field

from trtkv.cli.common import OVERRIDE_HELP, add_verb
from trtkv.core.options import Flag, Options

DEFAULT = ["smollm2_fp16kv", "smollm2_fp8kv", "smollm2_int8kv"]


class CompareOptions(Options):
    """`trtkv compare [options] [KEY=VALUE ...]`: each field one flag (trtkv.core.options)."""

    recipes: Annotated[
        str, Field(description=f"comma-separated (default {','.join(DEFAULT)})"), Flag()
    ] = ",".join(DEFAULT)
    output: Annotated[
        str | None, Field(description="output folder (default engines/compare)"), Flag()
    ] = None


def add_parser(sub: argparse._SubParsersAction) -> None:
    examples = (
        "  $ trtkv compare\n  $ trtkv compare --recipes smollm2_fp8kv,smollm2_int8kv "
        "bench.num_requests=4\n"
    )
    overrides_help = OVERRIDE_HELP + " (applied to every recipe)"
    add_verb(sub, "compare", examples, CompareOptions, run, recipe=None, overrides=overrides_help)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from trtkv.plan import figures
    from trtkv.recipe import load_recipe
    from trtkv.report.chain import run_chain
    from trtkv.report.compare import compare_output, write_compare_folder

    o = CompareOptions.from_args(args)
    names = [n.strip() for n in o.recipes.split(",") if n.strip()]
    recipes = [load_recipe(n, args.overrides) for n in names]  # validate all before running any
    out = compare_output(Path(o.output) if o.output else None)  # refused before any work
    results = [run_chain(n, args.overrides) for n in names]
    md = write_compare_folder(recipes, [figures(r) for r in recipes], results, out)
    print(md.read_text())
    failed = [r for r in results if r.failed]
    for r in failed:
        print(f"error: {r.recipe} failed at {r.failed}")
    return 2 if failed else 0
