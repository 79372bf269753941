"""Command-line options declared once: each option is one typed field of an `Options` model,
carrying its type, default, help and flag, and the verb's argparse arguments are derived from the
fields (the idea of AIPerf's `common/config/loadgen_config.py`: `Annotated[T,
Field(description=...), CLIParameter(...)] = default`):

    class BenchOptions(Options):
        golden_prompts: Annotated[int, Field(ge=1, description="prompts (default %(default)s)"), Flag()] = 8

gives `--golden-prompts GOLDEN_PROMPTS` with type int, default 8 and that help (argparse fills
`%(default)s`); `BenchOptions.from_args(args)` turns the parsed namespace back into the model, and a
value the field refuses is a TrtkvError naming the flag. Library callers build the same model with
keywords, validated the same way.

Derived per field: the flag is `--field-name` unless Flag names it (a name without dashes, the
field's own, is a positional argument); a field without a default is a required flag; the type comes
from T (int, float, str, Path; an Enum or a Literal gives `choices`, the Enum's values); a bool that
defaults to False is a `store_true` flag, one that defaults to True a `--no-...` flag
(`store_false`, named in Flag); a list field is either a repeated flag (Flag(repeat=True)) or one
value split on Flag(sep=...), where Flag(empty=...) is the word for an empty list; an optional
scalar may take a word for None (Flag(none="auto")); a field may name the argparse `type` that
parses its text (Flag(parse=...): argparse reports a bad value with the parser's own message, as a
hand-written flag would); flags of one Flag(exclusive=NAME) are a mutually exclusive group; a
positional list field takes any number of words. Light: argparse, typing and pydantic only.
"""  # noqa: E501

from __future__ import annotations

import argparse
import enum
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.fields import FieldInfo

from trtkv.core.errors import TrtkvError

OptionsT = TypeVar("OptionsT", bound="Options")
SCALARS = (int, float, str, Path)


@dataclass(frozen=True)
class Flag:
    """How one options field appears on the command line (what the field's type does not say)."""

    # default: "--" + the field name with "-" for "_"; ("NAME",): positional (the field's)
    names: tuple[str, ...] = ()
    metavar: str | None = None
    repeat: bool = False  # a list field: the flag once per value (argparse's "append")
    # a list field: one value, split on `sep`, items stripped, empty items dropped
    sep: str | None = None
    empty: str | None = None  # with `sep`: the word that stands for an empty list (e.g. "none")
    # an optional scalar: the word that stands for None on the command line (e.g. "auto")
    none: str | None = None
    # argparse's `type`: text -> the field's value (its errors: argparse's)
    parse: Callable[[str], Any] | None = None
    # the name of a mutually exclusive group of flags (at most one given)
    exclusive: str | None = None


def _optional_inner(annotation: Any) -> Any:
    """`T | None` -> T; anything else as it is."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _choices(kind: Any) -> list[str] | None:
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return [str(m.value) for m in kind]
    if typing.get_origin(kind) is Literal:
        return [str(a) for a in typing.get_args(kind)]
    return None


def _shown(default: Any) -> Any:
    """A default as argparse shows it: an Enum member by its value."""
    return default.value if isinstance(default, enum.Enum) else default


class Options(BaseModel):
    """A verb's options: one field per flag (fields without a Flag are not on the command line)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def flags(cls) -> dict[str, Flag]:
        """Field name -> its Flag, for the fields that are command-line options, in declaration
        order."""
        out = {}
        for name, info in cls.model_fields.items():
            flag = next((m for m in info.metadata if isinstance(m, Flag)), None)
            if flag is not None:
                out[name] = flag
        return out

    @classmethod
    def flag_names(cls, name: str) -> tuple[str, ...]:
        return cls.flags()[name].names or ("--" + name.replace("_", "-"),)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """One argparse argument per flagged field: type, choices, default and help from the
        field."""
        groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
        for name, flag in cls.flags().items():
            target: argparse.ArgumentParser | argparse._MutuallyExclusiveGroup = parser
            if flag.exclusive is not None:
                if flag.exclusive not in groups:
                    groups[flag.exclusive] = parser.add_mutually_exclusive_group()
                target = groups[flag.exclusive]
            target.add_argument(
                *cls.flag_names(name), **_argument(name, cls.model_fields[name], flag)
            )

    @classmethod
    def from_args(cls: type[OptionsT], args: argparse.Namespace) -> OptionsT:
        """The model from parsed arguments; TrtkvError naming the flag for a value the field
        refuses."""
        values: dict[str, Any] = {}
        for name, flag in cls.flags().items():
            value = getattr(args, name)
            if flag.sep is not None and isinstance(value, str):
                items = [x.strip() for x in value.split(flag.sep) if x.strip()]
                value = [x for x in items if x != flag.empty]
            elif (
                flag.none is not None
                and isinstance(value, str)
                and value.strip().lower() == flag.none
            ):
                value = None
            values[name] = value
        try:
            return cls(**values)
        except ValidationError as exc:
            err = exc.errors()[0]
            name = str(err["loc"][0])
            given = getattr(args, name, None)
            item = f" {err['input']!r}:" if len(err["loc"]) > 1 else ""
            word = cls.flags()[name].empty or cls.flags()[name].none
            also = f" (or {word})" if word else ""
            msg = err["msg"].removeprefix("Value error, ")  # pydantic's wrapping, not the reason
            raise TrtkvError(
                f"{cls.flag_names(name)[0]} {given!r}:{item} {msg}{also}. Next: see --help."
            ) from None


def _argument(name: str, info: FieldInfo, flag: Flag) -> dict[str, Any]:
    """The add_argument keywords of one field."""
    kind = _optional_inner(info.annotation)
    if flag.names[:1] == (name,):  # positional: argparse names its dest after it
        shown = {"metavar": flag.metavar} if flag.metavar else {}
        # any number of words, none: the default
        if typing.get_origin(kind) is list and not info.is_required():
            item = typing.get_args(kind)[0]
            return {
                "help": info.description,
                "nargs": "*",
                "default": list(info.get_default(call_default_factory=True)),
                "type": item if item in SCALARS else str,
                **shown,
            }
        if info.is_required():
            return {"help": info.description, "type": kind, **shown}
        raise TypeError(f"{name}: a positional option other than a list has no default")
    kw: dict[str, Any] = {"dest": name, "help": info.description}
    if info.is_required():
        kw["required"] = True
        default = None
    else:
        default = info.get_default(call_default_factory=True)
    if flag.metavar:
        kw["metavar"] = flag.metavar
    if flag.parse is not None:  # parsed by argparse, as the Flag says; the field checks the result
        return {**kw, "default": _shown(default), "type": flag.parse}
    if kind is bool:
        names = flag.names or ("--" + name.replace("_", "-"),)
        if default and not names[0].startswith("--no-"):
            raise TypeError(
                f"{name}: a flag for a bool that defaults to True is --no-...: name it in Flag"
            )
        return {
            **kw,
            "action": "store_false" if default else "store_true",
            "default": bool(default),
        }
    if typing.get_origin(kind) is list:
        item = typing.get_args(kind)[0]
        if flag.repeat:
            return {
                **kw,
                "action": "append",
                "default": list(default or []),
                "choices": _choices(item),
                "type": item if item in SCALARS else str,
            }
        if flag.sep is None:
            raise TypeError(
                f"{name}: a list option is repeated (Flag(repeat=True)) or split (Flag(sep=...))"
            )
        return {**kw, "default": default, "type": str}
    if flag.none is not None:  # a number or the word for None: parsed by the field, not by argparse
        return {**kw, "default": flag.none if default is None else default, "type": str}
    choices = _choices(kind)
    if choices is not None:
        return {**kw, "default": _shown(default), "choices": choices}
    if kind not in SCALARS:
        raise TypeError(f"{name}: no command-line form for {kind!r}")
    return {**kw, "default": default, "type": kind}
