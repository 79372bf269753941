"""The verbs whose options are a typed model (trtkv.core.options): every field is one argument of the verb, with the
field's default and help, and no argument of the verb lives outside the model (besides the recipe and overrides)."""

from __future__ import annotations

import argparse
import enum

import pytest

from trtkv.bench.options import BenchOptions
from trtkv.cli import build_parser
from trtkv.cli.generate import GenerateOptions
from trtkv.cli.init import InitOptions
from trtkv.core.options import Options

MODELS: dict[str, type[Options]] = {"bench": BenchOptions, "init": InitOptions, "generate": GenerateOptions}
RECIPE_ARGS = {"recipe", "overrides"}  # trtkv.cli.common.add_recipe_args, shared by every recipe verb


def verb_parser(verb: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[verb]


@pytest.mark.parametrize("verb", MODELS)
def test_the_verbs_arguments_are_the_models_fields(verb: str) -> None:
    model = MODELS[verb]
    actions = {a.dest: a for a in verb_parser(verb)._actions if a.dest not in ("help", *RECIPE_ARGS)}
    assert list(actions) == list(model.model_fields)  # same names, same order: nothing declared twice
    for name, info in model.model_fields.items():
        action = actions[name]
        assert action.help == info.description, name
        if info.is_required():
            assert action.required or not action.option_strings, name
            continue
        default = info.get_default(call_default_factory=True)
        flag = model.flags()[name]
        if flag.none is not None and default is None:  # shown as the word that stands for None ("auto")
            default = flag.none
        assert action.default == (default.value if isinstance(default, enum.Enum) else default), name
        choices = (info.annotation if isinstance(info.annotation, type) else None)
        if choices is not None and issubclass(choices, enum.Enum):
            assert action.choices == [m.value for m in choices], name
