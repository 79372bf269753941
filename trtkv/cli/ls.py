"""`trtkv ls`: the recipes found on disk."""

from __future__ import annotations

import argparse

from trtkv.cli.common import add_verb


def add_parser(sub: argparse._SubParsersAction) -> None:
    add_verb(sub, "ls", "  $ trtkv ls\n", None, run, recipe=None, overrides=None)


def run(args: argparse.Namespace) -> int:
    import yaml

    from trtkv.core import paths
    from trtkv.recipe import list_recipes, recipe_name

    found = list_recipes()
    if not found:
        print(f"no recipes under {paths.recipes_dir()}")
        return 1
    width = max(len(recipe_name(p)) for p in found)
    for path in found:
        try:
            data = yaml.safe_load(path.read_text()) or {}
            desc = data.get("description", "") if isinstance(data, dict) else ""
        except yaml.YAMLError:
            desc = "(malformed YAML: run trtkv validate)"
        print(f"{recipe_name(path):<{width}}  {desc}")
    return 0
