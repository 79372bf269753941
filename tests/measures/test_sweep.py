"""bench --sweep-input: fits against input length and the break-even of two KV formats with its interval."""

from __future__ import annotations

import pytest

from trtkv.bench.options import BenchOptions
from trtkv.cli.bench import sweep_lengths
from trtkv.contracts import BenchResults, BenchSweep
from trtkv.core.errors import TrtkvError
from trtkv.measures import sweep
from trtkv.recipe import load_recipe


def _level(slope: float, intercept: float, lengths: tuple[int, ...] = (1024, 4096, 16384, 65536),
           jitter: float = 0.02) -> dict:
    samples = {}
    for n in lengths:
        base = slope * n + intercept
        samples[str(n)] = {"itl_ms": [base * (1 + jitter * k) for k in (-1, 0, 1, 0.5, -0.5)],
                           "ttft_ms": [0.001 * n + 1e-8 * n * n + 5] * 5}
    return {"samples": samples}


def test_fits_recover_lines_exactly() -> None:
    x = [1024.0, 4096.0, 16384.0]
    lin = sweep.linear_fit(x, [4.37e-5 * v + 6.44 for v in x])
    assert lin and lin["slope"] == pytest.approx(4.37e-5) and lin["intercept"] == pytest.approx(6.44)
    quad = sweep.quadratic_fit(x, [2e-7 * v * v + 3e-3 * v + 20 for v in x])
    assert quad and quad["a"] == pytest.approx(2e-7) and quad["b"] == pytest.approx(3e-3) and quad["c"] == pytest.approx(20)
    assert sweep.linear_fit([5.0, 5.0], [1.0, 2.0]) is None and sweep.quadratic_fit(x[:2], [1.0, 2.0]) is None


def test_break_even_as_the_vllm_write_up_reads_it() -> None:
    """BF16 4.37e-5 x + 6.44 vs FP8 2.37e-5 x + 6.58 (the published H100 fits): they cross at 7,000 tokens."""
    be = sweep.break_even(_level(4.37e-5, 6.44, jitter=0.0), _level(2.37e-5, 6.58, jitter=0.0))
    assert be["verdict"] == "break-even" and be["tokens"] == pytest.approx(7000, rel=1e-6)
    assert be["interval"][0] == pytest.approx(7000, rel=1e-6)
    noisy = sweep.break_even(_level(4.37e-5, 6.44), _level(2.37e-5, 6.58))
    lo, hi = noisy["interval"]
    assert lo < noisy["tokens"] < hi
    again = sweep.break_even(_level(4.37e-5, 6.44), _level(2.37e-5, 6.58))
    assert again["interval"] == noisy["interval"]  # seeded: the same data give the same interval
    assert "drops below" in sweep.break_even_text("bf16", "fp8", noisy)


def test_never_and_always() -> None:
    never = sweep.break_even(_level(2e-5, 5.0), _level(3e-5, 5.5))
    assert never["verdict"] == "never within the measured range" and never["tokens"] is None
    assert "never within the measured range (1,024-65,536 tokens)" in sweep.break_even_text("a", "b", never)
    always = sweep.break_even(_level(4e-5, 6.0), _level(2e-5, 5.0))
    assert always["verdict"] == "faster over the whole measured range"
    one = sweep.break_even(_level(4e-5, 6.0, (1024,)), _level(2e-5, 5.0, (1024,)))
    assert one["verdict"].startswith("no fit")


def test_flat_noisy_lines_are_not_resolved() -> None:
    """Two ITLs flat within their noise (vLLM CPU on SmolLM2, 128-2,048 tokens): the fitted lines cross outside the
    range by chance, and the resampled crossings reach into it: no verdict either way."""
    flat = sweep.break_even(_level(0.0, 6.0), _level(1e-7, 5.99))
    lo, hi = flat["measured_range"]
    assert flat["verdict"] == sweep.UNRESOLVED and flat["tokens"] is None
    assert flat["interval"][0] <= hi and flat["interval"][1] >= lo
    assert "not resolved within the measured range" in sweep.break_even_text("a", "b", flat)


def test_summarize_fits_per_level() -> None:
    class Rec:
        ok = True

        def __init__(self, ttft: float, itl: float) -> None:
            self._t, self._i = ttft, itl

        def ttft_ms(self) -> float:
            return self._t

        def itl_ms(self) -> float:
            return self._i

    by_length = {n: {"concurrency=1": [Rec(0.01 * n, 0.001 * n + 2), Rec(0.01 * n, 0.001 * n + 2)]}
                 for n in (128, 512, 2048)}
    out = sweep.summarize(by_length)
    body = out["levels"]["concurrency=1"]
    assert out["input_tokens"] == [128, 512, 2048] and body["itl_fit"]["slope"] == pytest.approx(0.001)
    assert body["ttft_fit"]["slope"] == pytest.approx(0.01) and body["ttft_quadratic_fit"] is not None
    from trtkv.bench.outputs.results import sweep_rows

    rows = sweep_rows(BenchResults(sweep=BenchSweep.model_validate(out)))
    assert rows[0][:4] == ["concurrency=1", "128", "2.13", "1.3"] and rows[0][4].startswith("0.001 x input + 2")
    assert [r[1] for r in rows] == ["128", "512", "2,048"] and rows[1][0] == "" and rows[1][4] == ""
    assert rows[0][5] == "—"  # no client figures given
    # the client's own cost per length and level (trtkv.bench.load.levels.client_summary), a held-back length said so
    clients = {n: {"concurrency=1": {"workers": 1, "decided": "auto", "cpu_cores": 0.2, "per_worker": []}}
               for n in (128, 512)}
    clients[2048] = {"concurrency=1": {"workers": 2, "decided": "auto", "warning": "client process 0 used 0.97 of a "
                                       "core", "per_worker": []}}
    out = sweep.summarize(by_length, clients)
    client = out["levels"]["concurrency=1"]["client"]
    assert set(client) == {"128", "512", "2048"} and "per_worker" not in client["128"]
    rows = sweep_rows(BenchResults(sweep=BenchSweep.model_validate(out)))
    assert rows[0][5] == "1 process(es)" and rows[2][5] == "2 process(es); client process 0 used 0.97 of a core"


def test_sweep_lengths_are_checked_at_once() -> None:
    recipe = load_recipe("smollm2_fp8kv")
    import argparse

    p = argparse.ArgumentParser()
    BenchOptions.add_arguments(p)
    opts = BenchOptions.from_args(p.parse_args(["--sweep-input", "512, 128,512"]))
    assert sweep_lengths(opts.sweep_input or [], recipe) == [128, 512]
    with pytest.raises(TrtkvError, match="--sweep-input"):
        BenchOptions.from_args(p.parse_args(["--sweep-input", "128,abc"]))
    with pytest.raises(TrtkvError, match="positive token counts"):
        sweep_lengths([128, 0], recipe)
    with pytest.raises(TrtkvError, match="exceed"):
        sweep_lengths([128, 999999], recipe)
    from trtkv.core.errors import RecipeError

    with pytest.raises(RecipeError, match="bench.sweep_input_tokens"):
        load_recipe("smollm2_fp8kv", ["bench.sweep_input_tokens=[128,999999]"])
    # each length within trtkv.recipe.limits' "positions" range, named in the error; the count bounded too
    with pytest.raises(RecipeError, match=r"sweep_input_tokens\.1: .*allowed: 1\.\.134,217,728"):
        load_recipe("smollm2_fp8kv", ["bench.sweep_input_tokens=[128,999999999999]"])
    many = list(range(1, 66))
    with pytest.raises(RecipeError, match="at most 64"):
        load_recipe("smollm2_fp8kv", [f"bench.sweep_input_tokens={many}"])
    with pytest.raises(TrtkvError, match="at most 64"):
        sweep_lengths(many, recipe)


def test_compare_reports_the_break_even_and_plots(tmp_path) -> None:  # noqa: ANN001
    from trtkv.report.compare import _sweep_section

    def doc(slope: float, intercept: float) -> dict:
        body = _level(slope, intercept)
        body.update(sweep.fits({int(k): v for k, v in body["samples"].items()}))
        return {"input_tokens": [1024, 4096, 16384, 65536], "levels": {"concurrency=1": body}}

    rows = [{"recipe": "llama_bf16", "sweep": doc(4.37e-5, 6.44)}, {"recipe": "llama_fp8", "sweep": doc(2.37e-5, 6.58)}]
    md = "\n".join(_sweep_section(rows, tmp_path))
    assert "| llama_fp8 | concurrency=1 |" in md and "2.37e-05" in md
    assert "llama_fp8 ITL drops below llama_bf16's at ~" in md and "95% interval" in md
    assert rows[0]["sweep_break_even"][0]["verdict"] == "break-even"
    assert (tmp_path / "compare_itl_vs_input.png").stat().st_size > 0
