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


def add_verb(
    sub: argparse._SubParsersAction,
    name: str,
    examples: str,
    options: type[Options] | None,
    run: Callable[[argparse.Namespace], int],
    *,
    recipe: str | None = RECIPE_HELP,
    optional: bool = False,
    default: str | None = None,
    overrides: str | None = OVERRIDE_HELP,
) -> None:
    """The verb `name [RECIPE] [options] [KEY=VALUE ...]`, run by `run`: the recipe argument
    (`optional`, with `default`) unless `recipe` is None, `options`' flags, and the overrides unless
    `overrides` is None."""
    p = subparser(sub, name, examples)
    if recipe is not None:
        p.add_argument("recipe", nargs="?" if optional else None, default=default, help=recipe)
    if options is not None:
        options.add_arguments(p)
    if overrides is not None:
        p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=overrides)
    p.set_defaults(func=run)


def load(args: argparse.Namespace):  # noqa: ANN201 - returns trtkv.recipe.Recipe
    from trtkv.recipe import load_recipe

    return load_recipe(args.recipe, args.overrides)
