"""Recipe names are checked where a recipe is found: bad names and names that fold together are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtkv.core.errors import RecipeError
from trtkv.recipe import check_recipe_name, list_recipes, load_recipe
from trtkv.recipe.loader import find_recipe
from trtkv.recipe.names import RECIPE_NAME_RE, fold_recipe_name

from .conftest import Writer

ROOT = Path(__file__).resolve().parents[2]

# file name -> recipe name (stem); every one of these reached a stage before the rule existed
BAD_FILES = {
    "..yaml": ".",  # `trtkv repo` replaced triton_repo/. (every model's repository)
    "...yaml": "..",  # `trtkv deploy` wrote outside deploy/
    "$(touch X).yaml": "$(touch X)",  # run by the Slurm job's echo line
    "a\nrm -rf b.yaml": "a\nrm -rf b",  # a new command in rank.sh's comment lines
    'a"b.yaml': 'a"b',  # an extra parameters {} entry in config.pbtxt
    "Smollm2_fp8kv.yaml": "Smollm2_fp8kv",  # upper case is not a Kubernetes label
    "x.y.yaml": "x.y",
    "-lead.yaml": "-lead",
    "trail_.yaml": "trail_",  # a label value must end with a letter or digit
    "a b.yaml": "a b",
    f"{'a' * 52}.yaml": "a" * 52,  # one more than a label allows once trtkv-/suffixes are added
}


@pytest.mark.parametrize("file,name", list(BAD_FILES.items()), ids=[ascii(n) for n in BAD_FILES.values()])
def test_bad_name_given_as_path_is_refused(write: Writer, good: str, file: str, name: str) -> None:
    path = write(good, file)
    with pytest.raises(RecipeError) as info:
        load_recipe(str(path))
    (problem,) = info.value.problems
    assert repr(name) in problem, problem
    assert "lower-case letters, digits, '_' and '-'" in problem and "at most 51 characters" in problem
    assert "Next: rename the file" in problem
    assert "\n" not in problem and "\x1b" not in problem, "the message prints on one line"
    assert path.name in problem or ascii(str(path.resolve())) in problem, "the message names the file"


def test_good_names_load(write: Writer, good: str) -> None:
    for file in ("a.yaml", "0.yaml", "a-b_c9.yaml", f"{'a' * 51}.yaml", "smollm2_fp8kv_vllm.yml"):
        assert load_recipe(str(write(good, file))).name == Path(file).stem


def test_every_shipped_recipe_and_part_keeps_the_rule() -> None:
    names = [p.stem for p in (ROOT / "recipes").rglob("*.yaml")]
    assert names and all(RECIPE_NAME_RE.fullmatch(n) for n in names), names
    assert len({fold_recipe_name(p.stem) for p in list_recipes()}) == len(list_recipes())


def test_check_recipe_name_is_public_and_names_the_file() -> None:
    assert check_recipe_name("llama70b_fp8kv", Path("recipes/llama70b_fp8kv.yaml")) == "llama70b_fp8kv"
    with pytest.raises(RecipeError, match=r"deploy/x\.yaml: recipe name '\.\.' .*Next: rename the file, e.g. to "):
        check_recipe_name("..", Path("deploy/x.yaml"))


def test_names_that_fold_together_are_refused_together(recipes_home: Path, good: str) -> None:
    (recipes_home / "a_b.yaml").write_text(good)
    (recipes_home / "a-b.yaml").write_text(good)
    (recipes_home / "other.yaml").write_text(good)
    for action in (list_recipes, lambda: load_recipe("a_b"), lambda: load_recipe("a-b"),
                   lambda: load_recipe(str(recipes_home / "a_b.yaml"))):
        with pytest.raises(RecipeError) as info:
            action()
        (problem,) = info.value.problems
        assert str(recipes_home / "a_b.yaml") in problem and str(recipes_home / "a-b.yaml") in problem, problem
        assert "'a-b'" in problem and "Next: rename one of these files" in problem
    assert load_recipe("other").name == "other"  # a recipe that collides with nothing still loads


def test_a_path_that_folds_onto_a_shipped_name_is_refused(recipes_home: Path, write: Writer, good: str) -> None:
    (recipes_home / "a_b.yaml").write_text(good)
    with pytest.raises(RecipeError, match="fold to the same Kubernetes name 'a-b'"):
        load_recipe(str(write(good, "elsewhere/a-b.yaml")))
    assert load_recipe(str(write(good, "elsewhere/a_b.yaml"))).name == "a_b"  # a copy of the same recipe is fine


def test_a_bad_file_under_recipes_is_refused_by_ls(recipes_home: Path, good: str) -> None:
    (recipes_home / "ok.yaml").write_text(good)
    (recipes_home / "$(touch X).yaml").write_text(good)
    with pytest.raises(RecipeError, match=r"recipe name '\$\(touch X\)'"):
        list_recipes()
    assert load_recipe("ok").name == "ok"  # found by name, the good one is unaffected
    with pytest.raises(RecipeError, match="a recipe name is lower-case"):
        find_recipe("$(touch X)")
