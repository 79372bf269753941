"""`trtkv --help` says what each verb does today: one registry, one voice, backend and layout names read from the
backends (never typed into a help string by hand), and every example command parses."""

from __future__ import annotations

import argparse
import ast
import re
import shlex
from pathlib import Path

import pytest

CLI_DIR = Path(__file__).resolve().parents[2] / "trtkv" / "cli"
HELP_KEYWORDS = {"help", "description", "epilog"}  # argparse arguments that reach `--help`
HELP_CALLS = {"subparser", "add_verb", "Verb"}  # trtkv.cli helpers whose arguments are help text (verb help, examples)
# help text held in a name, e.g. EXAMPLES = """...""", or `examples = ...` inside add_parser
HELP_CONSTANT = re.compile(r"(EXAMPLES|HELP|EPILOG)$", re.IGNORECASE)


def engine_names() -> set[str]:
    """Every name a backend or layout goes by: trtkv.recipe.Backend values, their accepted aliases, each repo_layout."""
    from trtkv.backends import BACKENDS
    from trtkv.recipe import Backend
    from trtkv.recipe.schema import BACKEND_ALIASES

    return {b.value for b in Backend} | set(BACKEND_ALIASES) | {b.layout for b in BACKENDS.values()}


def _texts(node: ast.AST) -> list[str]:
    """The literal text in a help expression: an f-string's pieces joined by {} where a value is formatted in, and
    any string literal anywhere inside (a literal inside `{...}` is still typed by hand)."""
    if isinstance(node, ast.Constant):
        return [node.value] if isinstance(node.value, str) else []
    if isinstance(node, ast.JoinedStr):
        text, inner = "", []
        for value in node.values:
            if isinstance(value, ast.Constant):
                text += str(value.value)
            else:
                text += "{}"
                inner += [t for child in ast.iter_child_nodes(value) for t in _texts(child)]
        return [text, *inner]
    return [t for child in ast.iter_child_nodes(node) for t in _texts(child)]


def _prose(text: str) -> str:
    """The text without example command lines (`$ trtkv ...` before its # comment): those are parsed instead."""
    lines = []
    for line in text.splitlines():
        if line.lstrip().startswith("$ trtkv"):
            line = line.split(" #", 1)[1] if " #" in line else ""
        lines.append(line)
    return "\n".join(lines)


def help_literals(source: str) -> list[tuple[int, str]]:
    """(line, literal text) of every string that reaches a help screen in one trtkv.cli module's source."""
    found: list[tuple[int, ast.AST]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            found += [(kw.value.lineno, kw.value) for kw in node.keywords if kw.arg in HELP_KEYWORDS]
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name in HELP_CALLS:
                found += [(a.lineno, a) for a in node.args]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and HELP_CONSTANT.search(t.id) for t in targets):
                found.append((node.lineno, node.value))
    return [(line, _prose(t)) for line, expr in found for t in _texts(expr)]


def hand_written_names(source: str, names: set[str]) -> list[str]:
    """'line N: name in "text"' for each backend/layout name typed literally into help text (case-sensitive words)."""
    out = []
    for line, text in help_literals(source):
        for name in sorted(names):
            if re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", text):
                out.append(f"line {line}: {name!r} in {text.strip()[:100]!r}")
    return out


def test_the_check_catches_a_typed_name_and_allows_a_formatted_one() -> None:
    names = {"llmapi", "vllm", "ensemble"}
    assert hand_written_names('p.add_argument("--x", help="for backend llmapi")', names)
    assert hand_written_names('subparser(sub, "repo", "  $ trtkv repo r   # the ensemble layout\\n")', names)
    assert hand_written_names('EXAMPLES = "writes the vllm command"', names)
    assert hand_written_names('def add_parser(sub):\n    examples = "writes the vllm command"', names)
    assert hand_written_names("p.add_argument('--x', help=f\"{'llmapi'} only\")", names)  # a literal inside {}
    assert not hand_written_names('p.add_argument("--x", help=f"for backend {Backend.LLMAPI.value}")', names)
    assert not hand_written_names('EXAMPLES = "  $ trtkv init x --backend vllm   # a new recipe\\n"', names)
    assert not hand_written_names('p.add_argument("--x", help="the tensorrt_llm model, vllm_x, llmapi-ish")',
                                  {"tensorrt", "vllm"})
    assert not hand_written_names('x = "llmapi"', names)  # not help text


# the options models whose field descriptions are the verbs' flag help (trtkv.core.options)
OPTION_MODULES = sorted(CLI_DIR.parent.glob("*/options.py"))


@pytest.mark.parametrize("path", sorted(CLI_DIR.glob("*.py")) + OPTION_MODULES,
                         ids=lambda p: p.relative_to(CLI_DIR.parent).as_posix())
def test_no_backend_or_layout_name_is_typed_into_help(path: Path) -> None:
    bad = hand_written_names(path.read_text(), engine_names())
    assert not bad, (f"{path.name}: backend/layout names typed into help text (format them from trtkv.backends / "
                     f"trtkv.recipe.Backend instead):\n" + "\n".join(bad))


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _verb_help(parser: argparse.ArgumentParser) -> dict[str, str]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a.help or "" for a in action._choices_actions}


def test_every_verb_comes_from_the_one_registry() -> None:
    from trtkv.cli import build_parser
    from trtkv.cli.registry import VERBS

    parser = build_parser()
    assert list(_subparsers(parser)) == [v.name for v in VERBS]
    modules = {p.stem for p in CLI_DIR.glob("*.py") if "def add_parser(" in p.read_text()}
    assert modules == {v.module.rsplit(".", 1)[-1] for v in VERBS}, "a verb module missing from VERBS (or vice versa)"
    shown = _verb_help(parser)
    for verb in VERBS:
        assert shown[verb.name] == verb.render(), verb.name
        assert _subparsers(parser)[verb.name].description == verb.render(), verb.name


def test_verb_help_is_one_voice() -> None:
    """Lower-case imperative, one line, no full stop: the voice of argparse's own "show this help message and exit"."""
    from trtkv.cli import build_parser
    from trtkv.cli.registry import VERBS

    for name, text in _verb_help(build_parser()).items():
        assert re.match(r"[a-z]", text) and "\n" not in text and not text.endswith("."), f"{name}: {text!r}"
    for verb in VERBS:  # the template, so that one more backend in {backends} does not fail this
        assert len(verb.help) <= 100, f"{verb.name}: {len(verb.help)} characters: {verb.help!r}"


def test_help_names_every_backend_and_what_serve_does_now() -> None:
    from trtkv.backends import BACKENDS
    from trtkv.cli import build_parser
    from trtkv.recipe import Backend

    shown = _verb_help(build_parser())
    for verb in ("build", "serve"):
        for backend in Backend:
            assert re.search(rf"\b{backend.value}\b", shown[verb]), f"{verb} does not name backend {backend.value}"
    triton = {b.layout for b in BACKENDS.values() if b.repo is not None}  # the layouts with a Triton model
    assert triton and all(re.search(rf"\b{layout}\b", shown["repo"]) for layout in triton), shown["repo"]
    assert "supervis" in shown["serve"] and "--attach" in shown["serve"], shown["serve"]
    assert "supervis" in shown["stop"] and "supervis" in shown["status"]
    assert "tritonserver" not in shown["serve"] + shown["stop"], "serve/stop run any backend's server now"


def _examples(parser: argparse.ArgumentParser) -> list[str]:
    lines = [line for p in [parser, *_subparsers(parser).values()] for line in (p.epilog or "").splitlines()]
    return [line.split("$ ", 1)[1].split(" #", 1)[0] for line in lines if line.lstrip().startswith("$ trtkv")]


def test_every_example_command_parses() -> None:
    """What the literal-name check lets through (values in `$ trtkv` lines) is checked by argparse itself."""
    from trtkv.cli import build_parser
    from trtkv.recipe import list_recipes, recipe_name

    shipped = {recipe_name(p) for p in list_recipes()}
    examples = _examples(build_parser())
    assert len(examples) > 30
    for example in examples:
        for command in example.split("&&"):
            argv = shlex.split(command)
            assert argv[0] == "trtkv", example
            try:
                args, extra = build_parser().parse_known_args(argv[1:])
            except SystemExit:
                pytest.fail(f"example does not parse: {command}")
            assert all("=" in a and not a.startswith("-") for a in extra), f"{command}: unrecognized {extra}"
            recipe = getattr(args, "recipe", None)
            if recipe and not getattr(args, "check", False) and not recipe.endswith(".yaml"):
                assert recipe in shipped, f"{command}: no shipped recipe {recipe!r}"
