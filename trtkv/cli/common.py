"""Arguments shared by subcommands, and the verb parser whose help comes from the registry
(trtkv.cli.registry)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

TYPE_CHECKING = False  # typing's, without loading typing (see trtkv.core.lazy)
if TYPE_CHECKING:
    from trtkv.core.options import Options

RECIPE_HELP = "recipe name (see `trtkv ls`) or path to a .yaml file"
OVERRIDE_HELP = "overrides section.key=value (win over the file), e.g. build.max_batch_size=16"


def add_recipe_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", help=RECIPE_HELP)
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=OVERRIDE_HELP)


def subparser(sub: argparse._SubParsersAction, name: str, examples: str) -> argparse.ArgumentParser:
    """The verb's parser: its one line from the registry as help and description, then its
    examples."""
    from trtkv.cli.registry import verb

    help_text = verb(name).render()
    return sub.add_parser(
        name,
        help=help_text,
        description=help_text,
        epilog="examples:\n" + examples + "\n" + verb(name).where() + "\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def recipe_verb(
    sub: argparse._SubParsersAction,
    name: str,
    examples: str,
    options: type[Options],
    run: Callable[[argparse.Namespace], int],
) -> None:
    """The verb `name RECIPE [KEY=VALUE ...]` with `options`' flags, run by `run`."""
    p = subparser(sub, name, examples)
    add_recipe_args(p)
    options.add_arguments(p)
    p.set_defaults(func=run)


def load(args: argparse.Namespace):  # noqa: ANN201 - returns trtkv.recipe.Recipe
    from trtkv.recipe import load_recipe

    return load_recipe(args.recipe, args.overrides)
