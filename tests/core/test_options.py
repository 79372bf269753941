"""trtkv.core.options: argparse arguments derived from an Options model's fields, and back."""

from __future__ import annotations

import argparse
import enum
from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import Field

from trtkv.core.errors import TrtkvError
from trtkv.core.options import Flag, Options


class Color(str, enum.Enum):
    RED = "red"
    BLUE = "blue"


class Demo(Options):
    count: Annotated[int, Field(ge=1, description="how many (default %(default)s)"), Flag()] = 2
    ratio: Annotated[float | None, Field(description="a ratio"), Flag(metavar="R")] = None
    where: Annotated[Path | None, Field(description="a folder"), Flag()] = None
    color: Annotated[Color, Field(description="a color"), Flag()] = Color.RED
    mode: Annotated[Literal["a", "b"], Field(description="a mode"), Flag()] = "a"
    loud: Annotated[bool, Field(description="louder"), Flag()] = False
    colors: Annotated[list[Color] | None, Field(description="colors"), Flag(sep=",", empty="none")] = None
    tags: Annotated[list[str], Field(description="a tag (repeatable)"), Flag(names=("--tag",), repeat=True)] = []
    quiet: Annotated[bool, Field(description="no output"), Flag(names=("--no-output",))] = True
    internal: int = 0  # no Flag: not on the command line


def parse(*argv: str) -> Demo:
    parser = argparse.ArgumentParser()
    Demo.add_arguments(parser)
    return Demo.from_args(parser.parse_args(list(argv)))


def test_types_defaults_and_help_come_from_the_fields() -> None:
    parser = argparse.ArgumentParser()
    Demo.add_arguments(parser)
    help_text = " ".join(parser.format_help().split())
    assert "how many (default 2)" in help_text and "--ratio R" in help_text and "{red,blue}" in help_text
    assert "--internal" not in help_text and "--no-output" in help_text
    assert parse() == Demo()
    got = parse("--count", "3", "--ratio", "0.5", "--where", "x", "--color", "blue", "--mode", "b", "--loud",
                "--colors", "blue, red,none", "--tag", "t1", "--tag", "t2", "--no-output")
    assert got == Demo(count=3, ratio=0.5, where=Path("x"), color=Color.BLUE, mode="b", loud=True,
                       colors=[Color.BLUE, Color.RED], tags=["t1", "t2"], quiet=False)
    assert parse("--colors", "none").colors == []


def test_refusals_name_the_flag() -> None:
    with pytest.raises(TrtkvError, match="--count 0: Input should be greater than or equal to 1"):
        parse("--count", "0")
    with pytest.raises(TrtkvError, match=r"--colors 'red,green': 'green': Input should be 'red' or 'blue' \(or none\)"):
        parse("--colors", "red,green")
    with pytest.raises(SystemExit):  # argparse's own choices
        parse("--color", "green")


def test_a_field_without_a_command_line_form_is_refused_when_the_parser_is_built() -> None:
    class Bad(Options):
        on: Annotated[bool, Field(description="x"), Flag()] = True  # a True bool needs a --no- flag

    class Vague(Options):
        items: Annotated[list[str], Field(description="x"), Flag()] = []  # neither repeated nor split

    for model in (Bad, Vague):
        with pytest.raises(TypeError):
            model.add_arguments(argparse.ArgumentParser())
