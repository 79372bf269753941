"""`trtkv probe --ruler`: the bench's RULER items, answered with each format's cache and scored as the bench scores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trtkv.bench.load.prompts import load_tokenizer, tokenizer_dir
from trtkv.bench.tasks import ruler
from trtkv.cli import main
from trtkv.contracts.bench_doc import OK
from trtkv.core.errors import TrtkvError
from trtkv.kvcache.names import parse_format
from trtkv.kvcache.scales import KVScales
from trtkv.probe import ruler as probe_ruler
from trtkv.probe.setup import Loaded
from trtkv.recipe import load_recipe

TINY = ["probe.needle_seeds=1", "probe.needle_depths=[0.5]", "calibration.num_samples=4", "calibration.seq_len=64"]


def test_probe_items_are_the_bench_items(smollm2_dir: Path) -> None:
    """Same recipe and lengths: the probe's items are the prompts, token counts and answers the bench sends."""
    recipe = load_recipe("smollm2_fp8kv", ["bench.ruler_lengths=[1024]", "bench.ruler_samples=2"])
    plan = ruler.probe_plan(recipe, None, None, None)
    assert (plan.tasks, plan.lengths, plan.samples, plan.seed) == (list(ruler.TASK_NAMES), [1024], 2, ruler.RULER_SEED)
    items, tokenizer = plan.items, plan.tokenizer
    assert plan.tokenizer_dir == tokenizer_dir(recipe) and not plan.notes and len(items) == 12
    task = ruler.ruler_task(load_tokenizer(tokenizer_dir(recipe)), recipe.bench.ruler_lengths,
                            recipe.bench.ruler_samples, recipe.build.max_input_len, recipe.build.max_seq_len)
    assert [j.prompt for j in task.jobs] == [i.prompt for i in items]
    assert [j.params.max_tokens for j in task.jobs] == [i.max_tokens for i in items]
    assert [j.record.input_tokens for j in task.jobs] == [len(tokenizer.encode(i.prompt)) for i in items]
    for job in task.jobs:
        job.record.status = OK
    bench = task.score([j.record for j in task.jobs])["items"]
    assert [(r["task"], r["length"], r["index"], r["outputs"]) for r in bench] == [
        (i.task, i.length, i.index, i.outputs) for i in items]
    # fewer samples are the bench's first items; a subset of tasks the bench's items of those tasks
    fewer = ruler.probe_plan(recipe, ["vt"], [1024], 1).items
    assert [i.to_json() for i in fewer] == [i.to_json() for i in items if i.task == "vt" and i.index == 0]


def test_ruler_settings_name_the_allowed_values() -> None:
    recipe = load_recipe("smollm2_fp8kv")
    with pytest.raises(TrtkvError, match="Allowed: niah_single_1"):
        ruler.probe_plan(recipe, ["niah_single_9"], None, None)
    with pytest.raises(TrtkvError, match="max_position_embeddings"):
        ruler.probe_plan(recipe, None, [10**6], None)
    assert probe_ruler.common_prefix([[1, 2, 3, 4], [1, 2, 3, 9], [1, 2, 7]]) == 2
    assert probe_ruler.common_prefix([[1, 2], [1, 2]]) == 1  # every item keeps a token of its own to feed


class _Chars:
    """A tokenizer for the tiny model: one id per letter."""

    eos_token_id = None

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(97 + i % 26) for i in ids)


def test_a_shared_prefix_prefill_answers_as_separate_prefills(monkeypatch: pytest.MonkeyPatch) -> None:
    """Items of one (task, length) sharing a token prefix: prefilled once and copied, the greedy answers are the ones
    each item's own full prefill gives (a per-token format and KIVI, whose window the chunking must respect)."""
    from tests.support.models import tiny_llama

    model = tiny_llama(layers=2, kv_heads=2, head_dim=32, max_positions=512)
    loaded = Loaded(model, _Chars(), torch.device("cpu"), Path("."), [], [], "tiny",
                    {"num_layers": 2, "num_kv_heads": 2, "head_dim": 32})
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, 96, (150,), generator=gen).tolist()
    group = []
    for i in range(3):
        ids = prefix + torch.randint(0, 96, (20 + i,), generator=gen).tolist()
        item = ruler.RulerItem("niah_single_1", 512, i, 42, "", "", ["never-found"], len(ids), 8, 0)
        group.append((item, ids))
    scales = KVScales(k_amax=[4.0, 4.0], v_amax=[4.0, 4.0], source="test")
    for name in ("int4_g64", "kivi2"):
        shared, n = probe_ruler.answer_group(loaded, parse_format(name), scales, group, _Chars(), set(),
                                             ruler.string_match_all)
        assert n == 150
        monkeypatch.setattr(probe_ruler, "MIN_SHARED_PREFIX", 10**9)
        alone, none = probe_ruler.answer_group(loaded, parse_format(name), scales, group, _Chars(), set(),
                                             ruler.string_match_all)
        monkeypatch.undo()
        assert none == 0
        assert [a["prediction"] for a in shared] == [a["prediction"] for a in alone], name
        assert all(a["generated"] == 8 and a["stop"] == "max_tokens" for a in shared)


@pytest.mark.e2e  # runs the real model: not in `make check`
@pytest.mark.slow
def test_ruler_probe_scores_a_broken_cache_below_the_reference(tmp_path: Path, engines_tmp: Path, smollm2_dir: Path,
                                                              capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """SmolLM2 at 512 tokens, 2 tasks x 2 items: the 16-bit reference finds niah_single_1's number, int8 with scales
    of 1e-3 (every K/V element saturates) does not; probe.json/probe.md carry the table; a rerun answers from the cache.
    The items answer in at most 24 tokens (RULER's 128 for niah: a missed item, as every broken one is, decodes them
    all; the number takes ~8), made by the bench's own generator for the same haystack."""
    import dataclasses

    made = ruler.generate_items

    def shorter(*args: object, **kwargs: object) -> tuple[list, list[str]]:
        items, notes = made(*args, **kwargs)  # type: ignore[arg-type]
        return [dataclasses.replace(it, max_tokens=24) for it in items], notes

    monkeypatch.setattr(ruler, "generate_items", shorter)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # probe.json's `threads`: torch's count (--threads 1), an int
    broken = tmp_path / "kv_scales.json"
    broken.write_text(json.dumps({"kv_cache_quant_algo": "INT8",
                                  "layers": [{"layer": i, "k_amax": 1e-3, "v_amax": 1e-3} for i in range(30)]}))
    out = tmp_path / "probe"
    args = ["probe", "smollm2_fp8kv", *TINY, "--formats", "fp16,int8", "--lengths", "64", "--no-needle",
            "--decode-steps", "1", "--threads", "1", "--no-progress", "--output", str(out), "--scales", str(broken),
            "--ruler-tasks", "niah_single_1,niah_multikey_2", "--ruler-lengths", "512", "--ruler-samples", "2"]
    assert main(args) == 0
    written = json.loads((out / "probe.json").read_text())
    assert written["threads"] == 1 == written["model"]["threads"]
    doc = written["ruler"]
    assert [i["id"] for i in doc["items"]] == [f"{t}@512#{k}" for t in ("niah_single_1", "niah_multikey_2")
                                               for k in (0, 1)]
    ref, bad = doc["formats"]["fp16"], doc["formats"]["int8"]
    single = "niah_single_1"  # SmolLM2-135M finds it at 512 tokens; it misses niah_multikey_2's key among distractors
    assert ref["by_length"]["512"]["tasks"][single]["score"] == 100.0, ref["items"]
    assert bad["by_length"]["512"]["tasks"][single]["score"] < 100.0, bad["items"]
    assert bad["by_length"]["512"]["average"] < ref["by_length"]["512"]["average"]
    assert bad["accuracy"] < ref["accuracy"] and bad["accuracy_ci"][1] < 1.0
    assert ref["shared_prefix_tokens"] > 0  # niah_single_1's noise haystack: a shared token prefix
    assert any(r["stop"] == "all_found" for r in ref["items"])
    md = (out / "probe.md").read_text()
    assert "## RULER" in md and "| int8 | 512 |" in md
    printed = capsys.readouterr().out
    assert "RULER        fp16 @   512" in printed
    assert main(args) == 0  # resumed: every answer from the cache, the same scores
    again = json.loads((out / "probe.json").read_text())["ruler"]
    assert again["formats"]["int8"]["answered"] == 0 and again["formats"]["fp16"]["by_length"] == ref["by_length"]
    capsys.readouterr()
