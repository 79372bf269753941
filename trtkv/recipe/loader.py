"""Loading a recipe: find the file, read it with its `include:`s (relative to the including file; local keys win;
cycles are errors), apply `section.key=value` overrides, validate, and report every problem at once, each naming
the file, the field, the value and the allowed values."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from enum import Enum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from trtkv import paths
from trtkv.errors import RecipeError
from trtkv.recipe.rules import cross_field_problems
from trtkv.recipe.schema import KV_CACHE_ALIASES, KVCacheQuant, Recipe

# ---------------------------------------------------------------------------------------------
# Finding and reading recipe files


def list_recipes() -> list[Path]:
    """Every runnable recipe on disk (files under folders starting with `_` are shared parts)."""
    root = paths.recipes_dir()
    found = [p for p in root.rglob("*.yaml") if not any(part.startswith("_") for part in p.relative_to(root).parts)]
    return sorted(found)


def recipe_name(path: Path) -> str:
    return path.stem


def find_recipe(name_or_path: str) -> Path:
    """A recipe name (`smollm2_fp8kv`) or a path to a YAML file."""
    candidate = Path(name_or_path).expanduser()
    if candidate.suffix in (".yaml", ".yml") or "/" in name_or_path:
        if candidate.is_file():
            return candidate.resolve()
        raise RecipeError([f"{name_or_path}: no such recipe file. Next: check the path, or run `trtkv ls`."],
                          header="Recipe not found")
    available = {recipe_name(p): p for p in list_recipes()}
    if name_or_path in available:
        return available[name_or_path]
    hint = _did_you_mean(name_or_path, available)
    raise RecipeError(
        [f"unknown recipe {name_or_path!r}{hint}. Available: {', '.join(sorted(available)) or '(none)'}. "
         f"Next: `trtkv ls` lists them; a path to a .yaml file works too."],
        header="Recipe not found",
    )


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _read_yaml(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        origin = f" (included from {chain[-1]})" if chain else ""
        raise RecipeError([f"{path}: file not found{origin}. Next: fix the `include:` path."],
                          header="Recipe not readable") from None
    except OSError as exc:
        raise RecipeError([f"{path}: cannot read: {exc.strerror}."],
                          header="Recipe not readable") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise RecipeError([f"{path}{where}: malformed YAML: {problem}. Next: fix the syntax at that line."],
                          header="Recipe not readable") from None
    if data is None:
        raise RecipeError([f"{path}: the file is empty. Next: start from a shipped recipe, e.g. recipes/smollm2_fp8kv.yaml."],
                          header="Recipe not readable")
    if not isinstance(data, dict):
        raise RecipeError([f"{path}: the top level must be a mapping of sections, got {type(data).__name__}."],
                          header="Recipe not readable")
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


def load_tree(path: Path, chain: tuple[Path, ...] = ()) -> tuple[dict[str, Any], dict[str, Path]]:
    """Read `path` and its includes; returns the merged data and, per dotted key, the file that set it."""
    path = path.resolve()
    if path in chain:
        cycle = " -> ".join(str(p) for p in (*chain, path))
        raise RecipeError([f"{path}: include cycle: {cycle}. Next: remove one of these includes."],
                          header="Recipe not readable")
    data = _read_yaml(path, chain)
    includes = data.pop("include", [])
    if isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise RecipeError([f"{path}: include: must be a file name or a list of file names, got {includes!r}."],
                          header="Recipe not valid")
    merged: dict[str, Any] = {}
    prov: dict[str, Path] = {}
    for inc in includes:
        inc_data, inc_prov = load_tree(path.parent / inc, (*chain, path))
        merged = _merge(merged, inc_data)
        prov.update(inc_prov)
    merged = _merge(merged, data)
    _record(prov, data, path)
    return merged, prov


def parse_override(text: str) -> tuple[list[str], Any]:
    """`build.max_batch_size=16` -> (["build", "max_batch_size"], 16); the value is read as YAML."""
    if "=" not in text:
        raise RecipeError([f"override {text!r}: expected section.key=value, e.g. build.max_batch_size=16."],
                          header="Override not valid")
    key, raw = text.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise RecipeError([f"override {text!r}: the key is empty; expected section.key=value."], header="Override not valid")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return parts, value


def apply_overrides(data: dict[str, Any], prov: dict[str, Path], overrides: Iterable[str]) -> dict[str, Any]:
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
        prov[".".join(parts)] = Path("<command line>")
    return data


# ---------------------------------------------------------------------------------------------
# Validation and error reporting


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model class holding the field at `loc[:-1]` (to list sibling names)."""
    model: type[BaseModel] = Recipe
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        else:
            return None
    return model


def _enum_at(loc: tuple[Any, ...]) -> type[Enum] | None:
    model = _model_at(loc)
    names = [p for p in loc if not isinstance(p, int)]
    if model is None or not names:
        return None
    field = model.model_fields.get(str(names[-1]))
    if field is None:
        return None
    ann = field.annotation
    for candidate in (ann, *getattr(ann, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, Enum):
            return candidate
        for inner in getattr(candidate, "__args__", ()):
            if isinstance(inner, type) and issubclass(inner, Enum):
                return inner
    return None


def _where(prov: dict[str, Path], dotted: str, default: Path) -> Path:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        hit = prov.get(".".join(parts[:i]))
        if hit is not None:
            return hit
    return default


def _format_error(err: Any, prov: dict[str, Path], path: Path) -> str:
    loc = tuple(err["loc"])
    dotted = ".".join(str(p) for p in loc)
    file = _where(prov, dotted, path)
    kind = err["type"]
    value = err.get("input")
    if kind == "extra_forbidden":
        model = _model_at(loc)
        siblings = list(model.model_fields) if model is not None else []
        hint = _did_you_mean(str(loc[-1]), siblings)
        allowed = f" Allowed keys here: {', '.join(siblings)}." if siblings else ""
        return f"{file}: {dotted}: unknown key{hint}.{allowed}"
    if kind == "missing":
        return f"{file}: {dotted}: required field is missing. Next: add it (see the recipe reference in README.md)."
    enum = _enum_at(loc)
    if kind == "enum" and enum is not None:
        values = [e.value for e in enum]
        extra = ""
        if enum is KVCacheQuant:
            extra = f" (aliases: {', '.join(KV_CACHE_ALIASES)})"
        hint = _did_you_mean(str(value), values + list(KV_CACHE_ALIASES if enum is KVCacheQuant else []))
        return f"{file}: {dotted}: {value!r} is not allowed{hint or '.'} Allowed: {', '.join(values)}{extra}."
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    shown = "" if isinstance(value, (dict, list)) else f" (got {value!r})"
    return f"{file}: {dotted}: {msg}{shown}."


def validate_data(data: dict[str, Any], prov: dict[str, Path], path: Path) -> Recipe:
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        problems = [_format_error(e, prov, path) for e in exc.errors(include_url=False)]
        raise RecipeError(problems, header=f"Recipe {path.name} is not valid") from None
    problems = [f"{_where(prov, field, path)}: {field}: {msg}." for field, msg in cross_field_problems(recipe)]
    if problems:
        raise RecipeError(problems, header=f"Recipe {path.name} is not valid")
    return recipe


def load_recipe(name_or_path: str | Path, overrides: Iterable[str] = ()) -> Recipe:
    """Find, read, merge, override and validate a recipe; raises RecipeError listing every problem."""
    path = find_recipe(str(name_or_path))
    data, prov = load_tree(path)
    data = apply_overrides(data, prov, overrides)
    recipe = validate_data(data, prov, path)
    recipe._name = recipe_name(path)
    recipe._path = path
    return recipe


def dump_yaml(recipe: Recipe) -> str:
    return yaml.safe_dump(recipe.resolved(), sort_keys=False, default_flow_style=None, width=110)


