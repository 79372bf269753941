"""`trtkv validate`: check recipes and report every problem at once."""

from __future__ import annotations

import argparse
import sys
from typing import Annotated

from pydantic import Field

from trtkv.cli.common import add_verb
from trtkv.core.options import Flag, Options


class ValidateOptions(Options):
    """`trtkv validate [RECIPE ...] [KEY=VALUE ...]`: each field one argument
    (trtkv.core.options)."""

    recipes: Annotated[
        list[str],
        Field(
            description="recipe names or .yaml paths, then optional overrides section.key=value "
            "applied to each (as `trtkv show` and `trtkv plan` take them)"
        ),
        Flag(names=("recipes",), metavar="RECIPE|KEY=VALUE"),
    ] = []


def add_parser(sub: argparse._SubParsersAction) -> None:
    examples = (
        "  $ trtkv validate\n  $ trtkv validate smollm2_fp8kv\n  $ trtkv validate my_recipe.yaml\n"
        "  $ trtkv validate llama70b_fp8kv hardware.gpu=H200-141GB build.max_seq_len=65536\n"
    )
    add_verb(sub, "validate", examples, ValidateOptions, run, recipe=None, overrides=None)


def split_targets(words: list[str]) -> tuple[list[str], list[str]]:
    """(recipes, overrides): a word with '=' that names no existing file is an override
    (section.key=value)."""
    from pathlib import Path

    overrides = [w for w in words if "=" in w and not Path(w).is_file()]
    return [w for w in words if w not in overrides], overrides


def run(args: argparse.Namespace) -> int:
    from trtkv.core.errors import TrtkvError
    from trtkv.recipe import list_recipes, load_recipe

    names, overrides = split_targets(ValidateOptions.from_args(args).recipes)
    targets = names or [str(p) for p in list_recipes()]
    failed = 0
    for target in targets:
        try:
            recipe = load_recipe(target, overrides)
        except TrtkvError as exc:
            failed += 1
            print(f"FAIL {target}\n{exc}", file=sys.stderr)
            continue
        print(f"ok   {recipe.name}  ({recipe.path})")
    if failed:
        print(f"{failed} of {len(targets)} recipe(s) failed validation", file=sys.stderr)
        return 2
    return 0
