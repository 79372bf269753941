"""Fuzzing the loader and the override parser: any text gives a Recipe or a RecipeError, nothing else, quickly."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.support.recipes import GOOD
from trtkv.core.errors import RecipeError
from trtkv.recipe import Recipe, load_recipe

FUZZ = settings(max_examples=300, deadline=timedelta(milliseconds=1000), database=None,
                suppress_health_check=[HealthCheck.too_slow])

# Lines a mutation may insert: includes of every kind of target, YAML features, odd bytes.
SNIPPETS = ["include: base.yaml", "include: [base.yaml, base.yaml]", "include: r.yaml", "include: missing.yaml",
            "include: folder", "include: /dev/null", "include: loop.yaml", "include: {a: 1}", "x: &a [1, 2]",
            "y: *a", "z: *nope", "<<: {model: {source: x}}", "model: !!python/object:os.system {}", "a: !!binary AA==",
            "description: 2024-13-45", "? [a]\n: 1", "--- \n...", "quantization: {kv_cache: int8}", "\t", "'", "{", "[",
            "build: {max_batch_size: 99999999999999999999}", "triton: {host: '$(id)'}", "description: &s [*s]"]

mutation = st.one_of(
    st.tuples(st.just("insert"), st.integers(0, 40), st.sampled_from(SNIPPETS)),
    st.tuples(st.just("text"), st.integers(0, len(GOOD)), st.text(max_size=20)),
    st.tuples(st.just("delete"), st.integers(0, len(GOOD)), st.integers(0, 30)),
    st.tuples(st.just("bytes"), st.integers(0, len(GOOD)), st.binary(max_size=8)),
)


def mutate(text: str, steps: list[tuple]) -> bytes:
    """Apply insert-a-line, insert-text, delete-a-slice and insert-raw-bytes mutations in order."""
    data = text.encode()
    for kind, at, arg in steps:
        if kind == "insert":
            lines = data.split(b"\n")
            lines.insert(min(at, len(lines)), arg.encode())
            data = b"\n".join(lines)
        elif kind == "text":
            data = data[:at] + arg.encode("utf-8", "surrogatepass") + data[at:]
        elif kind == "delete":
            data = data[:at] + data[at + arg:]
        else:
            data = data[:at] + arg + data[at:]
    return data


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Include targets of every kind: a valid part, a folder, a symlink loop."""
    path = tmp_path_factory.mktemp("fuzz")
    (path / "base.yaml").write_text("build: {max_batch_size: 4}\n")
    (path / "folder").mkdir()
    (path / "loop.yaml").symlink_to(path / "loop.yaml")
    return path


def loads_or_refuses(path: Path | str, overrides: tuple[str, ...] = ()) -> None:
    try:
        recipe = load_recipe(str(path), overrides)
    except RecipeError as exc:
        assert exc.problems and all(isinstance(p, str) and p for p in exc.problems)
        return
    assert isinstance(recipe, Recipe)


@FUZZ
@given(steps=st.lists(mutation, max_size=6))
def test_mutated_recipes_load_or_refuse(folder: Path, steps: list[tuple]) -> None:
    path = folder / "r.yaml"
    path.write_bytes(mutate(GOOD, steps))
    loads_or_refuses(path)


@FUZZ
@given(text=st.text(max_size=300))
@example(text="description: " + "[" * 2000)  # a RecursionError before the depth limit
@example(text="description: 2024-13-45")  # a ValueError from datetime
def test_random_text_loads_or_refuses(folder: Path, text: str) -> None:
    path = folder / "t.yaml"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    loads_or_refuses(path)


overrides = st.one_of(
    st.text(max_size=60),
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(["build.max_batch_size", "triton.host", "description", "model",
                                                        "bench.concurrency", "include", "a.b.c", ".", "build."]),
              st.one_of(st.text(max_size=40), st.sampled_from([*SNIPPETS, "caf\udce9"]))),  # + a non-UTF-8 argv byte
)


@FUZZ
@given(texts=st.lists(overrides, max_size=3))
def test_overrides_load_or_refuse(folder: Path, texts: list[str]) -> None:
    path = folder / "o.yaml"
    if not path.exists():
        path.write_text(GOOD)
    loads_or_refuses(path, tuple(texts))
