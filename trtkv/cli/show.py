"""`trtkv show`: the fully resolved recipe (includes, overrides and defaults applied)."""

from __future__ import annotations

import argparse

from trtkv.cli.common import add_recipe_args, load, subparser


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = subparser(
        sub,
        "show",
        "  $ trtkv show smollm2_fp8kv\n  $ trtkv show llama70b_fp8kv build.max_batch_size=128\n",
    )
    add_recipe_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trtkv.recipe import dump_yaml

    recipe = load(args)
    print(f"# {recipe.name} ({recipe.path})")
    print(dump_yaml(recipe), end="")
    return 0
