"""`trtkv demo`: the whole chain for one recipe, then a one-screen summary; the server is always
stopped."""

from __future__ import annotations

import argparse

from trtkv.cli.common import add_verb


def add_parser(sub: argparse._SubParsersAction) -> None:
    examples = "  $ trtkv demo smollm2_fp8kv\n  $ trtkv demo smollm2_int8kv bench.num_requests=4\n"
    recipe_help = "recipe name or .yaml path"
    add_verb(
        sub, "demo", examples, None, run, recipe=recipe_help, optional=True, default="smollm2_fp8kv"
    )


def run(args: argparse.Namespace) -> int:
    from trtkv.plan import figures
    from trtkv.recipe import load_recipe
    from trtkv.report.chain import require_success, run_chain
    from trtkv.report.summary import print_summary

    recipe = load_recipe(args.recipe, args.overrides)  # fail fast on a bad recipe, before any work
    result = run_chain(args.recipe, args.overrides)
    print_summary(recipe, figures(recipe), result)
    require_success(result)
    return 0
