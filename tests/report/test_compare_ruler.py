"""`trtkv compare` and the printed summary show RULER's accuracy with its interval where a recipe's bench ran it (the
long-context task, where a quantized cache's error grows with the context); recipes without it get no ruler row. Real
results.json files of `trtkv bench` (tests/data/bench_results/README.md says how each was made)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from trtkv.plan.handoff import figures
from trtkv.recipe import layout, load_recipe
from trtkv.report.chain import ChainResult
from trtkv.report.compare import PLOT_ACCURACY, plot_values, write_compare
from trtkv.report.summary import collect, summary_lines

RESULTS = Path(__file__).resolve().parents[1] / "data" / "bench_results"


def _bench(recipe_name: str, run: str) -> None:
    folder = layout.bench_dir(load_recipe(recipe_name))
    folder.mkdir(parents=True)
    shutil.copy(RESULTS / run / "results.json", folder / "results.json")


def _compare(names: list[str], out: Path) -> str:
    recipes = [load_recipe(n) for n in names]
    md = write_compare(recipes, [figures(r) for r in recipes], [ChainResult(n) for n in names], out)
    return md.read_text()


def test_compare_shows_ruler_where_a_bench_ran_it(engines_tmp: Path) -> None:
    _bench("smollm2_fp16kv", "2026-11-30_a2184b0")  # quiz, golden, needle; no ruler
    _bench("smollm2_fp8kv", "2026-12-07_ci15")  # with ruler: accuracy 0 of 1 item, Wilson [0.000, 0.793]
    (row,) = [x for x in _compare(["smollm2_fp16kv", "smollm2_fp8kv"], engines_tmp / "c").splitlines()
              if x.startswith("| ruler.accuracy (95% interval)")]
    assert row == "| ruler.accuracy (95% interval) | — | 0.000 [0.000, 0.793] |"
    # the plot's accuracy panel: a ruler bar for the recipe that ran it, none (not a 0) for the other
    rows = json.loads((engines_tmp / "c" / "compare.json").read_text())
    ruler = plot_values(rows, PLOT_ACCURACY)["ruler.accuracy"]
    assert math.isnan(ruler[0]) and ruler[1] == 0.0
    recipe = load_recipe("smollm2_fp8kv")
    assert any("ruler.accuracy 0.000 [0.000, 0.793]" in line for line in summary_lines(collect(recipe, figures(recipe))))


def test_no_ruler_row_without_a_ruler_bench(engines_tmp: Path) -> None:
    _bench("smollm2_fp16kv", "2026-11-30_a2184b0")
    assert "ruler" not in _compare(["smollm2_fp16kv"], engines_tmp / "c")
    rows = json.loads((engines_tmp / "c" / "compare.json").read_text())
    assert list(plot_values(rows, PLOT_ACCURACY)) == ["quiz.accuracy", "golden.agreement", "needle.accuracy"]
