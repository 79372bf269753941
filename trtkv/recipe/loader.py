"""Loading a recipe: find the file, read it with its `include:`s (relative to the including file;
local keys win; cycles are errors), apply `section.key=value` overrides, validate, and report every
problem at once, each naming the file, the field, the value and the allowed values. Reading the
files and applying the overrides, with the file that set each key, is trtkv.recipe.tree's job."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from enum import Enum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from trtkv.core import paths
from trtkv.core.errors import RecipeError
from trtkv.recipe.enums import KV_CACHE_ALIASES, KVCacheQuant
from trtkv.recipe.limits import RANGES
from trtkv.recipe.names import (
    RECIPE_NAME_RE,
    RECIPE_NAME_RULE,
    check_recipe_name,
    collision_problems,
    fold_recipe_name,
    recipe_name_problem,
    shown,
)
from trtkv.recipe.rules import add_default_tasks, cross_field_problems
from trtkv.recipe.schema import Recipe
from trtkv.recipe.tree import COMMAND_LINE, apply_overrides, load_tree, resolve_path

# ---------------------------------------------------------------------------------------------
# Finding recipe files


def _runnable_files() -> list[Path]:
    """The .yaml files under recipes/ outside folders starting with `_` (those hold shared
    parts)."""
    root = paths.recipes_dir()
    found = [
        p
        for p in root.rglob("*.yaml")
        if not any(part.startswith("_") for part in p.relative_to(root).parts)
    ]
    return sorted(found)


def list_recipes() -> list[Path]:
    """Every runnable recipe on disk; RecipeError naming each file whose name breaks the rule or
    collides."""
    found = _runnable_files()
    problems = [p for p in (recipe_name_problem(recipe_name(f), f) for f in found) if p is not None]
    problems += collision_problems((recipe_name(f), f) for f in found)
    if problems:
        raise RecipeError(problems, header=f"Recipes in {shown(paths.recipes_dir())} not usable")
    return found


def recipe_name(path: Path) -> str:
    """The recipe's name: its file name without .yaml (checked by check_recipe_name where a recipe
    is found)."""
    return path.stem


def _refuse_collisions(path: Path) -> None:
    """A recipe whose name folds to the same Kubernetes name as another runnable recipe's is refused
    with it."""
    name = recipe_name(path)
    named = [(name, path)] + [
        (recipe_name(f), f)
        for f in _runnable_files()
        if fold_recipe_name(recipe_name(f)) == fold_recipe_name(name) and resolve_path(f) != path
    ]
    problems = collision_problems(named)
    if problems:
        raise RecipeError(problems, header="Recipe name not allowed")


def find_recipe(name_or_path: str) -> Path:
    """A recipe name (`smollm2_fp8kv`) or a path to a YAML file; its name is checked here
    (check_recipe_name)."""
    candidate = Path(name_or_path).expanduser()
    if candidate.suffix in (".yaml", ".yml") or "/" in name_or_path:
        resolved = resolve_path(candidate)
        if not resolved.exists():
            raise RecipeError(
                [
                    f"{shown(name_or_path)}: no such recipe file. Next: check the path, or run "
                    "`trtkv ls`."
                ],
                header="Recipe not found",
            )
        if not resolved.is_file():
            raise RecipeError(
                [f"{shown(name_or_path)}: not a regular file. Next: name a .yaml file."],
                header="Recipe not readable",
            )
        check_recipe_name(recipe_name(resolved), resolved)
        _refuse_collisions(resolved)
        return resolved
    available = {
        recipe_name(p): p for p in _runnable_files() if RECIPE_NAME_RE.fullmatch(recipe_name(p))
    }
    if name_or_path in available:
        _refuse_collisions(available[name_or_path].resolve())
        return available[name_or_path]
    if not available and not paths.recipes_dir().is_dir():
        raise RecipeError(
            [
                f"unknown recipe {name_or_path!r}: there is no recipes folder at "
                f"{shown(paths.recipes_dir())} (trtkv looks in TRTKV_HOME/recipes, else the "
                "checkout's recipes/, else ./recipes). Next: set TRTKV_HOME to a trtkv checkout, "
                "`trtkv init NAME --model PATH` to write ./recipes/NAME.yaml, or pass the path of "
                "a .yaml file."
            ],
            header="Recipe not found",
        )
    hint = _did_you_mean(name_or_path, available)
    rule = (
        "" if RECIPE_NAME_RE.fullmatch(name_or_path) else f" (a recipe name is {RECIPE_NAME_RULE})"
    )
    raise RecipeError(
        [
            f"unknown recipe {name_or_path!r}{rule}{hint}. Available: "
            f"{', '.join(sorted(available)) or '(none)'}. Next: `trtkv ls` lists them; a path to a "
            ".yaml file works too."
        ],
        header="Recipe not found",
    )


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`; did you mean 'kv_cache'?` (a full sentence end: callers add no period after it), or ""."""
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


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
        return f"{file}: {dotted}: unknown key{hint or '.'}{allowed}"
    if kind == "missing":
        return (
            f"{file}: {dotted}: required field is missing. Next: add it (see the recipe "
            "reference in docs/recipes.md)."
        )
    enum = _enum_at(loc)
    if kind == "enum" and enum is not None:
        values = [e.value for e in enum]
        extra = ""
        if enum is KVCacheQuant:
            extra = f" (aliases: {', '.join(KV_CACHE_ALIASES)})"
        hint = _did_you_mean(
            str(value), values + list(KV_CACHE_ALIASES if enum is KVCacheQuant else [])
        )
        return (
            f"{file}: {dotted}: {value!r} is not allowed{hint or '.'} Allowed: "
            f"{', '.join(values)}{extra}."
        )
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    # the value once: not again where the validator's own message already quotes it
    quoted = isinstance(value, (dict, list)) or (isinstance(value, str) and value[:60] in msg)
    got = "" if quoted else f" (got {value!r:.60})"
    return f"{file}: {dotted}: {msg}{got}{_range_hint(loc, kind)}."


def _range_hint(loc: tuple[Any, ...], kind: str) -> str:
    """For a number outside its range: the range and the largest published value it admits
    (trtkv.recipe.limits)."""
    if kind not in (
        "greater_than",
        "greater_than_equal",
        "less_than",
        "less_than_equal",
        "finite_number",
    ):
        return ""
    # an entry of a bounded list (bench.sweep_input_tokens[2]): the list's range
    while loc and isinstance(loc[-1], int):
        loc = loc[:-1]
    model = _model_at(loc)
    field = model.model_fields.get(str(loc[-1])) if model is not None else None
    extra = field.json_schema_extra if field is not None else None
    name = extra.get("range") if isinstance(extra, dict) else None
    return f"; allowed: {RANGES[name].text()}" if isinstance(name, str) and name in RANGES else ""


def validate_data(data: dict[str, Any], prov: dict[str, Path], path: Path) -> Recipe:
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        problems = [_format_error(e, prov, path) for e in exc.errors(include_url=False)]
        raise RecipeError(problems, header=f"Recipe {path.name} is not valid") from None
    add_default_tasks(recipe)
    overridden = sorted(k for k, v in prov.items() if v == COMMAND_LINE)
    problems = [
        f"{_rule_site(prov, field, path, overridden)}: {field}: {msg}."
        for field, msg in cross_field_problems(recipe)
    ]
    if problems:
        raise RecipeError(problems, header=f"Recipe {path.name} is not valid")
    return recipe


def _rule_site(prov: dict[str, Path], field: str, path: Path, overridden: list[str]) -> str:
    """Where a cross-field rule broke: the field's file, and the command-line overrides when they
    took part (a rule reported at a field from the file may have been broken by an override of
    another field)."""
    file = _where(prov, field, path)
    if file == COMMAND_LINE or not overridden:
        return str(file)
    return f"{file} with the {COMMAND_LINE} overrides of {', '.join(overridden)}"


def load_recipe(name_or_path: str | Path, overrides: Iterable[str] = ()) -> Recipe:
    """Find, read, merge, override and validate a recipe; raises RecipeError listing every
    problem."""
    path = find_recipe(str(name_or_path))
    data, prov = load_tree(path)
    data = apply_overrides(data, prov, overrides)
    recipe = validate_data(data, prov, path)
    recipe._name = recipe_name(path)
    recipe._path = path
    return recipe


def dump_yaml(recipe: Recipe) -> str:
    return yaml.safe_dump(recipe.resolved(), sort_keys=False, default_flow_style=None, width=110)
