"""`trtkv validate`: check recipes and report every problem at once."""

from __future__ import annotations

import argparse
import sys

from trtkv.cli.common import subparser


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = subparser(sub, "validate",
                  "  $ trtkv validate\n  $ trtkv validate smollm2_fp8kv\n  $ trtkv validate my_recipe.yaml\n")
    p.add_argument("recipes", nargs="*", help="recipe names or .yaml paths")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trtkv.core.errors import TrtkvError
    from trtkv.recipe import list_recipes, load_recipe

    targets = args.recipes or [str(p) for p in list_recipes()]
    failed = 0
    for target in targets:
        try:
            recipe = load_recipe(target)
        except TrtkvError as exc:
            failed += 1
            print(f"FAIL {target}\n{exc}", file=sys.stderr)
            continue
        print(f"ok   {recipe.name}  ({recipe.path})")
    if failed:
        print(f"{failed} of {len(targets)} recipe(s) failed validation", file=sys.stderr)
        return 2
    return 0
