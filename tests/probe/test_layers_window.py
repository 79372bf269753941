"""`trtkv probe --per-layer` on a sliding-window hybrid (the tiny random Gemma 3): the sweep's window-aware passes and
sampled rows, the sliding-window skip set vLLM serves by name, the bytes a sequence holds, and the needles asked from
the verification passes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import Gemma3ForCausalLM

from tests.support.tiny_gemma3 import tiny_gemma3
from trtkv.kvcache.formats import kv_bytes_per_token
from trtkv.kvcache.names import parse_format
from trtkv.kvcache.scales import KVScales

WINDOW = 6
SWEEP, LONGEST = 128, 320


class _CharTokenizer:
    """One id per character (ids < 128): enough for the needle text on the tiny model."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> object:
        class _Out:
            input_ids = [ord(c) % 128 for c in text]
        return _Out()


@pytest.fixture(scope="module")
def gemma(one_torch_thread: None) -> Gemma3ForCausalLM:
    model = tiny_gemma3(window=WINDOW)
    model.config._attn_implementation = "sdpa"
    return model


def _loaded(gemma: Gemma3ForCausalLM, tmp_path: Path):  # noqa: ANN202
    from trtkv.probe.needles import place_needles, plan_needles
    from trtkv.probe.setup import Loaded

    text = torch.randint(3, 128, (LONGEST + 500,), generator=torch.Generator().manual_seed(11)).tolist()
    ids, plan = place_needles(text, plan_needles(_CharTokenizer(), [LONGEST], [0.5], 1), LONGEST)
    info = {"num_layers": 4, "num_kv_heads": 1, "head_dim": 32, "sliding_window": WINDOW, "head_positions": 40,
            "full_layers": [2]}
    return Loaded(gemma, _CharTokenizer(), torch.device("cpu"), tmp_path, ids, [], "tiny", info, plan)


def test_per_layer_on_a_windowed_model(gemma: Gemma3ForCausalLM, tmp_path: Path, engines_tmp: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Every pass is the sweep's windowed pass at its sampled rows (uniform fp8's KL at the longest length is the
    sweep's run_format figure), the sliding layers kept is a verified set deployed as `[sliding_window]`, bytes are
    what a LONGEST-token sequence holds (sliding layers: their window), needles come from the verification passes,
    and a rerun runs nothing."""
    from trtkv.probe import layers
    from trtkv.probe.measure import reference_hidden, run_format
    from trtkv.probe.metrics import head_positions
    from trtkv.recipe import load_recipe

    loaded = _loaded(gemma, tmp_path)
    scales = KVScales(k_amax=[4.0] * 4, v_amax=[4.0] * 4, source="test")
    monkeypatch.setattr(layers, "load_model", lambda recipe, settings: loaded)
    monkeypatch.setattr(layers, "probe_scales", lambda *a: scales)
    monkeypatch.setattr(layers, "SENSITIVITY_ROWS", 40)
    recipe = load_recipe("gemma3_fp8kv_vllm")
    out = tmp_path / "pl"
    logs: list[str] = []
    opts = layers.PerLayerOptions("fp8", [SWEEP, LONGEST], max_keep=1, needle_lengths=[LONGEST], sweep_length=SWEEP)
    path = layers.run_per_layer(recipe, opts, out, log=logs.append)
    doc = json.loads(path.read_text())
    assert doc["windowed"]["sliding_layers"] == [0, 1, 3] and doc["windowed"]["full_layers"] == [2]
    win = doc["windowed"]
    assert (win["sensitivity_rows"], win["longest_rows"], win["verification_rows"]) == (32, 40, 40 + 16)
    assert [r["attention"] for r in doc["layers"]] == ["sliding", "sliding", "full", "sliding"]
    for r in doc["layers"]:
        assert r["gain"] == pytest.approx(doc["sensitivity_uniform"]["kl"] - r["kl_all_but"])
    # the verification pass (one chunk more, needle stops: fp32 noise flips a few fp8 roundings) agrees at the sweep
    assert doc["uniform"]["kl_sweep"] == pytest.approx(doc["sensitivity_uniform"]["kl"], rel=1e-2)
    # the sweep's own pass at its sampled rows gives the same uniform KL at the longest length
    rows = head_positions(loaded, LONGEST - 1)
    ref, _ = reference_hidden(loaded, LONGEST, tmp_path / "sweep", rows)
    run = run_format(loaded, parse_format("fp8"), scales, LONGEST, ref)

    assert doc["uniform"]["kl_longest"] == pytest.approx(float(run["metrics"]["kl"].double().mean()), rel=1e-4)
    # the sliding layers kept: verified, served by vLLM by name
    sw = doc["sets"]["sliding_window"]
    assert sw["keep"] == [0, 1, 3] and sw["skip"] == ["sliding_window"] and "vllm" in sw["serving"]["engines"]
    assert layers._deploy(sw, doc["gpus_usable"])["vllm"] == "--kv-cache-dtype-skip-layers sliding_window"
    assert doc["sets"]["full_attention"]["keep"] == [2]
    assert set(sw["kl_by_length"]) == {str(SWEEP), str(LONGEST)}
    # bytes a LONGEST-token sequence holds, per token: the full layer every token, a sliding layer its window
    fp8, bf16 = kv_bytes_per_token(1, 1, 32, "fp8"), kv_bytes_per_token(1, 1, 32, "bf16")
    assert doc["uniform"]["bytes_per_token"] == pytest.approx((LONGEST + 3 * WINDOW) * fp8 / LONGEST)
    assert sw["bytes_per_token"] == pytest.approx((LONGEST * fp8 + 3 * WINDOW * bf16) / LONGEST)
    assert sw["bytes_per_token_formula"] == fp8 + 3 * bf16
    assert doc["uniform"]["stored_bytes_per_token"] < doc["uniform"]["bytes_per_token_formula"]
    # needles: asked from each verification pass (no separate haystack: loaded.haystack_ids is empty)
    for p in doc["points"]:
        assert p["needle"][str(LONGEST)] in (0.0, 1.0)
    md = (out / "per_layer_fp8.md").read_text()
    assert "sliding layers kept" in md and "KV bytes/token held at 320" in md
    # rerun: every pass from the cache
    layers.run_per_layer(recipe, opts, out, log=logs.append)
    assert json.loads(path.read_text())["passes"]["run"] == 0
