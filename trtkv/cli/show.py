"""`trtkv show`: the fully resolved recipe (includes, overrides and defaults applied)."""

from __future__ import annotations

import argparse

from trtkv.cli.common import add_verb, load


def add_parser(sub: argparse._SubParsersAction) -> None:
    examples = (
        "  $ trtkv show smollm2_fp8kv\n  $ trtkv show llama70b_fp8kv build.max_batch_size=128\n"
    )
    add_verb(sub, "show", examples, None, run)


def run(args: argparse.Namespace) -> int:
    from trtkv.recipe import dump_yaml

    recipe = load(args)
    print(f"# {recipe.name} ({recipe.path})")
    print(dump_yaml(recipe), end="")
    return 0
