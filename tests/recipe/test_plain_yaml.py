"""The recipe loader reads plain data only: duplicate keys, deep nesting, aliases, odd files and bytes are refused
as RecipeErrors naming the file (the hazards that could hang or exhaust memory are in test_hazards.py)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from trtkv.core.errors import RecipeError
from trtkv.recipe import load_recipe
from trtkv.recipe.plain_yaml import MAX_DEPTH
from trtkv.recipe.tree import parse_override

from .conftest import Writer


def problem_of(path: Path, overrides: tuple[str, ...] = ()) -> str:
    with pytest.raises(RecipeError) as info:
        load_recipe(str(path), overrides)
    (problem,) = info.value.problems
    return problem


def test_duplicate_section_names_the_key_and_both_lines(write: Writer, good: str) -> None:
    path = write(good + "quantization: {weights: none, kv_cache: int8}\n")  # line 11; the first is line 8
    problem = problem_of(path)
    assert problem.startswith(f"{path}:11:"), problem
    assert "duplicate key 'quantization' at line 11 (first at line 8" in problem


def test_duplicate_nested_key(write: Writer, good: str) -> None:
    path = write(good.replace("  num_layers: 30\n", "  num_layers: 30\n  num_layers: 31\n"))
    assert "duplicate key 'num_layers' at line 4 (first at line 3" in problem_of(path)
    path = write(good.replace("{weights: fp8, kv_cache: fp8}", "{weights: fp8, kv_cache: fp8, 'weights': none}"))
    assert "duplicate key 'weights'" in problem_of(path)


def test_merge_keys_still_work(write: Writer, good: str) -> None:
    """`<<:` merges (safe_load semantics): a local key overriding a merged one is not a duplicate."""
    text = good.replace("build: {backend: reference, max_input_len: 1024, max_seq_len: 2048}",
                        "x-build: &b {backend: reference, max_input_len: 1024, max_seq_len: 2048}\n"
                        "build: {<<: *b, max_input_len: 512}")
    problem = problem_of(write(text))  # x-build is no recipe key, but it read and merged
    assert "x-build: unknown key" in problem, problem


def nested(depth: int) -> str:
    return "description: " + "[" * depth + "]" * depth + "\n"


def test_nesting_beyond_the_limit(write: Writer, good: str) -> None:
    path = write(good + nested(MAX_DEPTH))  # the top mapping is one level, so this is MAX_DEPTH + 1
    problem = problem_of(path)
    assert str(path) in problem and f"nested deeper than {MAX_DEPTH} levels" in problem
    problem = problem_of(write(good + nested(100_000)))  # far beyond Python's recursion limit: still an error
    assert str(path) in problem and "nest" in problem, problem  # ours, or libyaml's own limit (1000) when it looks ahead
    problem = problem_of(write(good + nested(MAX_DEPTH - 1)))  # within the limit: read, then refused by the schema
    assert "description" in problem and "nested deeper" not in problem


def test_recursive_alias(write: Writer, good: str) -> None:
    assert "a value that contains it" in problem_of(write(good + "x: &a [*a]\n"))


def test_undecodable_bytes_name_the_line(write: Writer, good: str) -> None:
    path = write(good.encode() + b"description: caf\xe9\n")  # Latin-1, line 11
    problem = problem_of(path)
    assert str(path) in problem and "line 11" in problem and "is not UTF-8" in problem and "Next: save" in problem


def test_values_python_cannot_read_are_errors(write: Writer, good: str) -> None:
    assert "cannot read '2024-13-45' as timestamp" in problem_of(write(good + "description: 2024-13-45\n"))
    assert "as int" in problem_of(write(good + f"description: {'9' * 5000}\n"))
    assert "malformed YAML" in problem_of(write(good + "description: a\x00b\n"))


def test_file_over_the_cap(write: Writer, good: str) -> None:
    path = write(good + "#" * (1 << 20) + "\n")
    problem = problem_of(path)
    assert str(path) in problem and "larger than 1,048,576 bytes" in problem


def test_includes_share_the_cap(write: Writer, good: str) -> None:
    """Ten includes of 200 KB each: each under the cap, together over it (parse time is bounded per recipe)."""
    for i in range(10):
        write(f"x{i}: '{'a' * 200_000}'\n", f"big{i}.yaml")
    top = write("include: [" + ", ".join(f"big{i}.yaml" for i in range(10)) + "]\n", "top.yaml")
    problem = problem_of(top)
    assert "this recipe and its includes hold more than 1048576 characters in all (included from" in problem


def test_non_regular_include_targets(write: Writer, good: str, tmp_path: Path) -> None:
    (tmp_path / "folder").mkdir()
    child = write("include: folder\n", "child.yaml")
    problem = problem_of(child)
    assert "a directory, not a regular file (included from" in problem and str(child) in problem
    problem = problem_of(write("include: /dev/null\n", "dev.yaml"))  # /dev/zero and FIFOs: test_hazards.py
    assert "/dev/null: a character device, not a regular file" in problem, problem


def test_symlink_loop(write: Writer, good: str, tmp_path: Path) -> None:
    os.symlink(tmp_path / "loop.yaml", tmp_path / "loop.yaml")
    problem = problem_of(write("include: loop.yaml\n", "child.yaml"))
    assert "loop.yaml: symlink loop (included from" in problem, problem
    assert "symlink loop" in problem_of(tmp_path / "loop.yaml")


def test_bad_include_names(write: Writer) -> None:
    assert "not a valid file name" in problem_of(write("include: \"a\\0b.yaml\"\n"))
    assert "must be a file name or a list" in problem_of(write("include: {a: 1}\n"))


def test_include_fan_out_is_bounded(write: Writer, good: str) -> None:
    """Each level includes the next twice: 2**8 reads here (and 2**n for n levels) without a budget."""
    write(good, "p8.yaml")
    for i in range(8):
        write(f"include: [p{i + 1}.yaml, p{i + 1}.yaml]\n", f"p{i}.yaml")
    assert "more than 32 files read for one recipe" in problem_of(write("include: p0.yaml\n", "top.yaml"))


def test_override_values_follow_the_same_rules() -> None:
    for text, words in [("description={a: 1, a: 2}", "duplicate key 'a'"),
                        ("description=" + "[" * 40 + "]" * 40, "nested deeper than 32"),
                        ("description=[&a [1], *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, "
                         "*a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a]", "more than 32 aliases"),
                        (".".join(["a"] * 40) + "=1", "the key is nested deeper than 32")]:
        with pytest.raises(RecipeError) as info:
            parse_override(text)
        assert words in str(info.value), info.value
    with pytest.raises(RecipeError, match="is not UTF-8 text"):
        parse_override("description=caf\udce9")  # a Latin-1 argv byte, as Python passes it on
    assert parse_override("build.max_batch_size=16") == (["build", "max_batch_size"], 16)
    assert parse_override("description=a: b: c") == (["description"], "a: b: c")  # not YAML: stays a string
    assert parse_override("description=2024-13-45") == (["description"], "2024-13-45")


@pytest.mark.parametrize("loader", ["_PyPlainDataLoader", "_CPlainDataLoader"])
def test_both_parsers_keep_the_rules(monkeypatch: pytest.MonkeyPatch, loader: str) -> None:
    """PyYAML without libyaml reads with the Python parser: the same limits hold there."""
    from trtkv.recipe import plain_yaml

    if not hasattr(plain_yaml, loader):
        pytest.skip("PyYAML without libyaml")
    monkeypatch.setattr(plain_yaml, "PlainDataLoader", getattr(plain_yaml, loader))
    assert plain_yaml.load_yaml("a: {b: [1, 2]}\nc: &x 1\nd: *x\n") == {"a": {"b": [1, 2]}, "c": 1, "d": 1}
    for text, words in [("a: 1\nb: 2\na: 3\n", "duplicate key 'a' at line 3 (first at line 1"),
                        ("a: " + "[" * 40 + "]" * 40, "nested deeper than 32"),
                        ("a: &a [*a]", "contains it"),
                        ("a: &a [1]\nb: [" + ", ".join(["*a"] * 40) + "]", "more than 32 aliases")]:
        with pytest.raises(plain_yaml.YAMLLimitError, match=re.escape(words)):
            plain_yaml.load_yaml(text)
