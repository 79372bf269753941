"""The verbs whose options are a typed model (trtkv.core.options): every field is one argument of the verb, with the
field's default and help, and no argument of the verb lives outside the model (besides the recipe and overrides)."""

from __future__ import annotations

import argparse
import enum
import importlib

import pytest

from trtkv.cli import build_parser
from trtkv.cli.registry import VERBS
from trtkv.core.options import Flag, Options

RECIPE_ARGS = {"recipe", "overrides"}  # trtkv.cli.common.add_verb's, shared by every recipe verb (demo, compare)


def verb_model(verb: str) -> type[Options] | None:
    """The verb module's options model: the one Options class it holds (None for a verb of recipe arguments only)."""
    module = importlib.import_module(next(v.module for v in VERBS if v.name == verb))
    found = {v for v in vars(module).values() if isinstance(v, type) and issubclass(v, Options) and v is not Options}
    assert len(found) <= 1, f"{verb}: more than one options model: {found}"
    return next(iter(found), None)


MODELS: dict[str, type[Options]] = {v.name: m for v in VERBS if (m := verb_model(v.name)) is not None}


def verb_parser(verb: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[verb]


def test_every_verb_with_options_has_a_model() -> None:
    """No verb declares a flag outside a model: a verb without a model takes the recipe arguments only."""
    assert set(MODELS) >= {"bench", "init", "generate", "probe", "stop", "deploy", "serve", "status", "plan", "build",
                           "calibrate", "repo", "report", "compare", "validate"}
    for verb in (v.name for v in VERBS if v.name not in MODELS):
        extra = [a.dest for a in verb_parser(verb)._actions if a.dest not in ("help", *RECIPE_ARGS)]
        assert extra == [], f"{verb}: arguments outside an options model: {extra}"


@pytest.mark.parametrize("verb", MODELS)
def test_the_verbs_arguments_are_the_models_fields(verb: str) -> None:
    model = MODELS[verb]
    actions = {a.dest: a for a in verb_parser(verb)._actions if a.dest not in ("help", *RECIPE_ARGS)}
    assert list(actions) == list(model.model_fields)  # same names, same order: nothing declared twice
    for name, info in model.model_fields.items():
        action = actions[name]
        assert action.help == info.description, name
        choices = (info.annotation if isinstance(info.annotation, type) else None)
        if choices is not None and issubclass(choices, enum.Enum):
            assert action.choices == [m.value for m in choices], name
        if info.is_required():
            assert action.required or not action.option_strings, name
            continue
        default = info.get_default(call_default_factory=True)
        flag = model.flags()[name]
        if flag.none is not None and default is None:  # shown as the word that stands for None ("auto")
            default = flag.none
        assert action.default == (default.value if isinstance(default, enum.Enum) else default), name


# the fewest words each verb parses from: its recipe (where it takes one) and its required options
MINIMAL = {"init": ["n", "--model", "m"], "validate": [], "compare": [], "deploy": ["r", "--target", "k8s"],
           "generate": ["r", "--prompt", "p"]}
REQUIRED = {"init": {"name": "n", "model": "m"}, "deploy": {"target": "k8s"}, "generate": {"prompt": "p"},
            "scales": {"target": "r"}}


@pytest.mark.parametrize("verb", MODELS)
def test_parsed_defaults_are_the_models_defaults(verb: str) -> None:
    """Nothing given: the parsed flags make the model its defaults make (argparse's defaults are the fields')."""
    args = build_parser().parse_args([verb, *MINIMAL.get(verb, ["r"])])
    assert MODELS[verb].from_args(args) == MODELS[verb](**REQUIRED.get(verb, {}))


def test_an_exclusive_group_and_a_parsed_list() -> None:
    """Flag(exclusive=...) flags exclude each other; Flag(parse=...) values are argparse's to refuse."""
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["deploy", "r", "--target", "k8s", "--replicas", "2", "--target-concurrency", "8"])
    args = parser.parse_args(["probe", "r", "--lengths", "512,1024", "--formats", "FP8, int8"])
    o = MODELS["probe"].from_args(args)
    assert (o.lengths, o.formats) == ([512, 1024], ["fp8", "int8"])
    with pytest.raises(SystemExit):
        parser.parse_args(["probe", "r", "--lengths", "512,x"])
    assert isinstance(MODELS["probe"].flags()["lengths"], Flag)
