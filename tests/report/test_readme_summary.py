"""The README's and the quickstart's "one real summary" have the shape `make demo` prints today (#57):
every label present, in order. Their figures are a real run's (the text beside each block names it); this test
holds the words between the figures to the code, so a changed summary line fails here until the docs are rerun."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trtkv.report.chain import CHAIN, ChainResult, StepResult
from trtkv.report.summary import chain_line, summary_lines

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["README.md", "docs/quickstart.md"]


def shape(line: str) -> str:
    """A summary line with its figures, intervals and paths taken out: what must not drift."""
    line = re.sub(r"\[[-\d., ]+\]", "[#]", line)  # a 95% interval
    line = re.sub(r"(?<![\w/])[^\s()]*/[^\s()]*", "<path>", line)  # a stage's folder
    line = re.sub(r"(?<![A-Za-z_])\d[\d,]*(\.\d+)?", "#", line)  # a figure (not the digits of a name)
    return " ".join(line.split())


def printed() -> list[str]:
    """What `trtkv demo smollm2_fp8kv` prints, from the functions that print it, on the demo's set of results."""
    bench = {
        "level": "concurrency=1",
        **{f"{k}.p{q}": 1.5 for k in ("time_to_first_token", "inter_token_latency") for q in (50, 99)},
        "output_token_throughput.max": 2.5,
        "request_throughput.max": 0.5,
    }
    for key in ("quiz.accuracy", "golden.agreement", "needle.accuracy"):
        bench[key], bench[f"{key}.ci"] = 0.5, [0.25, 0.75]
    data = {
        "recipe": "smollm2_fp8kv",
        "weights": "fp8",
        "kv_cache": "fp8",
        "kv_format": "fp8",
        "kv_bytes_per_token": 11520,
        "bench": bench,
        "planner": {
            "hardware": "cpu",
            "memory_gib": 23.5,
            "kv_budget_gib": 0.176,
            "tokens_fit": 16384,
            "max_seq_len": 4096,
            "sequences_at_max_seq_len": 4,
        },
        "stages": {
            s: {"path": f"/home/u/trtkv/engines/smollm2_fp8kv/{s}", "wall_seconds": 1.5}
            for s in ("checkpoint", "engine", "serve", "bench", "triton_repo")
        },
    }
    steps = [StepResult(verb, 3.0, 0) for verb in [*CHAIN, "stop"]]
    return [chain_line(ChainResult("smollm2_fp8kv", steps)), *summary_lines(data)]


def shown(doc: str) -> list[str]:
    """The lines of the doc's code block that starts with the chain line."""
    text = (ROOT / doc).read_text()
    found = re.search(r"```\n(Chain for .*?)```", text, re.S)
    assert found, f"{doc}: no code block starting with 'Chain for' (the summary of a real `make demo`)"
    return found.group(1).rstrip("\n").split("\n")


@pytest.mark.parametrize("doc", DOCS)
def test_the_docs_summary_has_the_shape_the_demo_prints(doc: str) -> None:
    want = [shape(x) for x in printed()]
    got = [shape(x) for x in shown(doc)]
    assert got == want, f"{doc}'s summary no longer has the shape `make demo` prints: rerun it and paste its summary"


def test_shape_keeps_labels_and_drops_figures() -> None:
    a = shape("  accuracy:   quiz.accuracy 0.475 [0.329, 0.625], golden.agreement 0.312 [0.121, 0.531]")
    assert a == "accuracy: quiz.accuracy # [#], golden.agreement # [#]"
    assert shape("Chain for smollm2_fp8kv: calibrate 34s; total 228 s") == "Chain for smollm2_fp8kv: calibrate #s; total # s"
    assert shape("  bench:      /work/main/engines/smollm2_fp8kv/bench  (160.7 s)") == "bench: <path> (# s)"
    # the README block of an older release (no intervals, no ITL) does not pass for today's
    assert shape("  accuracy:   quiz.accuracy 0.475, golden.agreement 0.449") != a
