"""A recipe's data before validation: its YAML file read with its `include:`s (relative to the
including file; local keys win; cycles, too many files or characters are errors), command-line
`section.key=value` overrides applied, and for every dotted key the file (or the command line) that
set it, for the error messages of trtkv.recipe.loader."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from trtkv.core.errors import RecipeError
from trtkv.recipe.names import shown
from trtkv.recipe.plain_yaml import (
    MAX_DEPTH,
    MAX_FILE_BYTES,
    FileNotReadable,
    YAMLLimitError,
    load_yaml,
    read_text,
)


def resolve_path(path: Path, origin: str = "") -> Path:
    """`path` made absolute with its links followed; RecipeError for a symlink loop or an impossible
    name."""
    try:
        return path.resolve()
    # RuntimeError: how Python < 3.13 reports a symlink loop
    except (OSError, RuntimeError, ValueError):
        _read_text(path, origin)
        raise RecipeError(
            [f"{shown(path)}: cannot resolve the path{origin}. Next: check it."],
            header="Recipe not readable",
        ) from None


def _read_text(path: Path, origin: str) -> str:
    try:
        return read_text(path)
    except FileNotReadable as exc:
        raise RecipeError(
            [f"{shown(path)}: {exc.problem}{origin}. Next: {exc.next_step}."],
            header="Recipe not readable",
        ) from None


def _yaml_problem(exc: yaml.YAMLError) -> tuple[str, str]:
    """(":line:column" or "", the problem) of a YAML error."""
    mark = getattr(exc, "problem_mark", None)
    where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return where, problem


def _read_yaml(
    path: Path, chain: tuple[Path, ...], budget: list[int] | None = None
) -> dict[str, Any]:
    """One file's YAML as a mapping; `budget` ([files, characters] read so far for this recipe)
    bounds the includes."""
    origin = f" (included from {shown(chain[-1])})" if chain else ""
    text = _read_text(path, origin)
    if budget is not None:
        budget[1] += len(text)
        if budget[1] > MAX_FILE_BYTES:
            raise RecipeError(
                [
                    f"{shown(path)}: this recipe and its includes hold more than {MAX_FILE_BYTES} "
                    f"characters in all{origin}. Next: include fewer or smaller files."
                ],
                header="Recipe not readable",
            )
    try:
        data = load_yaml(text)
    except YAMLLimitError as exc:
        where, problem = _yaml_problem(exc)
        raise RecipeError(
            [
                f"{shown(path)}{where}: not plain recipe data: {problem}. Next: write each key "
                "once, without deep nesting or aliases."
            ],
            header="Recipe not readable",
        ) from None
    except yaml.YAMLError as exc:
        where, problem = _yaml_problem(exc)
        raise RecipeError(
            [
                f"{shown(path)}{where}: malformed YAML: {problem}. Next: fix the syntax at that "
                "line."
            ],
            header="Recipe not readable",
        ) from None
    if data is None:
        raise RecipeError(
            [
                f"{shown(path)}: the file is empty. Next: start from a shipped recipe, e.g. "
                f"recipes/smollm2_fp8kv.yaml."
            ],
            header="Recipe not readable",
        )
    if not isinstance(data, dict):
        raise RecipeError(
            [
                f"{shown(path)}: the top level must be a mapping of sections, got "
                f"{type(data).__name__}."
            ],
            header="Recipe not readable",
        )
    return data


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """Deep merge: mappings merge key by key, anything else in `top` replaces `base`."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _record(prov: dict[str, Path], data: Any, file: Path, prefix: str = "") -> None:
    """Remember which file set each leaf, for error messages."""
    if isinstance(data, dict):
        for key, value in data.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            prov[path] = file
            _record(prov, value, file, path)


# files one recipe may read, itself and its includes (a chain or a diamond of includes)
MAX_INCLUDED_FILES = 32


def load_tree(path: Path, chain: tuple[Path, ...] = ()) -> tuple[dict[str, Any], dict[str, Path]]:
    """Read `path` and its includes; returns the merged data and, per dotted key, the file that set
    it."""
    return _load_tree(path, chain, [0, 0])


def _load_tree(
    path: Path, chain: tuple[Path, ...], budget: list[int]
) -> tuple[dict[str, Any], dict[str, Path]]:
    path = resolve_path(path, f" (included from {shown(chain[-1])})" if chain else "")
    if path in chain:
        cycle = " -> ".join(shown(p) for p in (*chain, path))
        raise RecipeError(
            [f"{shown(path)}: include cycle: {cycle}. Next: remove one of these includes."],
            header="Recipe not readable",
        )
    budget[0] += 1
    if budget[0] > MAX_INCLUDED_FILES:
        raise RecipeError(
            [
                f"{shown(path)}: more than {MAX_INCLUDED_FILES} files read for one recipe "
                f"(included from {shown(chain[-1])}). Next: include fewer files."
            ],
            header="Recipe not readable",
        )
    data = _read_yaml(path, chain, budget)
    includes = data.pop("include", [])
    if isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise RecipeError(
            [
                f"{shown(path)}: include: must be a file name or a list of file names, got "
                f"{includes!r:.200}."
            ],
            header="Recipe not valid",
        )
    merged: dict[str, Any] = {}
    prov: dict[str, Path] = {}
    for inc in includes:
        inc_data, inc_prov = _load_tree(path.parent / inc, (*chain, path), budget)
        merged = _merge(merged, inc_data)
        prov.update(inc_prov)
    merged = _merge(merged, data)
    _record(prov, data, path)
    return merged, prov


def parse_override(text: str) -> tuple[list[str], Any]:
    """`build.max_batch_size=16` -> (["build", "max_batch_size"], 16); the value is read as YAML,
    under the file rules (size, nesting, aliases, duplicate keys); a value that is not YAML at all
    stays a string, and a mapping or list only counts as one in flow style (`{...}`, `[...]`):
    `triton.host=::` is the text `::`."""
    if "=" not in text:
        raise RecipeError(
            [f"override {text!r:.200}: expected section.key=value, e.g. build.max_batch_size=16."],
            header="Override not valid",
        )
    if len(text.encode("utf-8", "surrogatepass")) > MAX_FILE_BYTES:
        raise RecipeError(
            [
                f"override {text[:40]!r}...: larger than {MAX_FILE_BYTES} bytes (the cap for a "
                f"recipe file). Next: put the setting in a recipe file."
            ],
            header="Override not valid",
        )
    key, raw = text.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise RecipeError(
            [f"override {text!r:.200}: the key is empty; expected section.key=value."],
            header="Override not valid",
        )
    if len(parts) > MAX_DEPTH:
        raise RecipeError(
            [
                f"override {key!r:.200}: the key is nested deeper than {MAX_DEPTH} levels. Next: "
                f"name a recipe field, e.g. build.max_batch_size."
            ],
            header="Override not valid",
        )
    try:
        value = load_yaml(raw) if raw.strip() else ""
    except YAMLLimitError as exc:
        _, problem = _yaml_problem(exc)
        raise RecipeError(
            [
                f"override {key!r:.200}: the value is not plain recipe data: {problem}. Next: "
                "write each key once, without deep nesting or aliases."
            ],
            header="Override not valid",
        ) from None
    except yaml.YAMLError:
        value = raw
    if isinstance(value, (dict, list)) and not raw.strip().startswith(("{", "[")):
        value = raw.strip()  # `triton.host=::` is an address, not YAML's block mapping {":": null}
    return parts, value


COMMAND_LINE = Path("<command line>")  # the provenance of an override


def apply_overrides(
    data: dict[str, Any], prov: dict[str, Path], overrides: Iterable[str]
) -> dict[str, Any]:
    for text in overrides:
        parts, value = parse_override(text)
        node = data
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[parts[-1]] = value
        prov[".".join(parts)] = COMMAND_LINE
    return data
