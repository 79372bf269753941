"""Recipe names: one rule, checked where a recipe is found, because a name becomes a folder, a shell
word, a pbtxt string and a Kubernetes label (`_` folded to `-`)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from pathlib import Path

from trtkv.core.errors import RecipeError

# Lower-case letters, digits, `_` and `-`; starts and ends with a letter or digit (a Kubernetes
# label value must); at most 51 characters, so `trtkv-<name>-<suffix>` still fits a 63-character
# label once `_` folds to `-`.
RECIPE_NAME_MAX = 51
RECIPE_NAME_RE = re.compile(rf"[a-z0-9](?:[a-z0-9_-]{{0,{RECIPE_NAME_MAX - 2}}}[a-z0-9])?")
RECIPE_NAME_RULE = (
    f"lower-case letters, digits, '_' and '-', starting and ending with a letter or digit, at most "
    f"{RECIPE_NAME_MAX} characters"
)


def shown(value: object) -> str:
    """A path or name as it may be printed: as is when printable, else Python-escaped (no newline or
    escape codes)."""
    text = str(value)
    return text if text.isprintable() else ascii(text)


def fold_recipe_name(name: str) -> str:
    """The Kubernetes form of a recipe name (`a_b` -> `a-b`): two recipes must never fold to the
    same one."""
    return name.replace("_", "-")


def suggest_recipe_name(name: str) -> str:
    """A name close to `name` that keeps the rule (for the `Next:` step)."""
    slug = re.sub(r"[^a-z0-9_-]+", "_", name.lower())[:RECIPE_NAME_MAX].strip("_-")
    return slug or "my_recipe"


def recipe_name_problem(name: str, path: Path) -> str | None:
    """The problem with `name` (the stem of `path`), or None when it keeps the rule."""
    if RECIPE_NAME_RE.fullmatch(name):
        return None
    return (
        f"{shown(path)}: recipe name {name!r} (the file name without .yaml) is not allowed: a name "
        f"is {RECIPE_NAME_RULE} (it becomes a folder name, a shell word and a Kubernetes label). "
        f"Next: rename the file, e.g. to {suggest_recipe_name(name)}.yaml."
    )


def check_recipe_name(name: str, path: Path | str) -> str:
    """`name` when it keeps the recipe-name rule, else RecipeError naming the file, the rule and the
    fix.

    Stages that take a recipe name from elsewhere (a manifest, a flag) call this too, as defence in
    depth.
    """
    problem = recipe_name_problem(name, Path(path))
    if problem is not None:
        raise RecipeError([problem], header="Recipe name not allowed")
    return name


def collision_problems(named: Iterable[tuple[str, Path]]) -> list[str]:
    """One problem per group of recipes whose names differ but fold to the same Kubernetes name,
    naming every file."""
    groups: dict[str, list[tuple[str, Path]]] = {}
    for name, path in named:
        groups.setdefault(fold_recipe_name(name), []).append((name, path))
    out = []
    for folded, members in sorted(groups.items()):
        if len({name for name, _ in members}) < 2:
            continue
        files = ", ".join(shown(path) for _, path in sorted(members, key=lambda m: str(m[1])))
        out.append(
            f"{files}: recipe names {', '.join(repr(n) for n in sorted({n for n, _ in members}))} "
            f"fold to the same Kubernetes name {folded!r} ('_' becomes '-'), so their deployments "
            "would replace each other. Next: rename one of these files."
        )
    return out


# Host names (triton.host lands in commands, URLs and README `curl` lines)
_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def is_ip_or_host_name(value: str) -> bool:
    """An IPv4/IPv6 address (no zone) or an RFC 1123 host name whose last label is not all digits
    (RFC 3696)."""
    try:
        ipaddress.ip_address(value)
        return "%" not in value
    except ValueError:
        pass
    labels = value.split(".")
    return (
        0 < len(value) <= 253
        and all(_HOST_LABEL.fullmatch(label) for label in labels)
        and not labels[-1].isdigit()
    )
