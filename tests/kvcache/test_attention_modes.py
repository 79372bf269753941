"""The attention modes of trtkv/data/kv_formats.json: every engine kernel is sourced at a commit, the modes parse, and
`probe.attention: auto` picks each shipped recipe's engine path (and says why where it falls back to cache-only)."""

from __future__ import annotations

import copy
import json
import re

import pytest

from trtkv.core.errors import TrtkvError
from trtkv.kvcache.attention_modes import CACHE_ONLY, load_attention, parse_attention, select_mode, table_markdown
from trtkv.kvcache.engines import TABLE_PATH
from trtkv.probe.attention import resolve_modes
from trtkv.recipe import load_recipe
from trtkv.recipe.engine_attention import recipe_mode

COMMIT = re.compile(r"@[0-9a-f]{40}$|installed wheel")


def test_every_engine_kernel_names_its_source_at_a_commit() -> None:
    table = load_attention()
    assert CACHE_ONLY in table.modes and not table.modes[CACHE_ONLY].quantizes
    for mode in table.modes.values():
        for kernel in (mode.prefill, mode.decode):
            if kernel.quantizes:
                assert kernel.sources, (mode.name, kernel.kernel)
                assert all(COMMIT.search(s.at) for s in kernel.sources), (mode.name, [s.at for s in kernel.sources])
            if kernel.p != "none":
                assert kernel.p_scale in (256.0, 448.0) and kernel.tile(64) and kernel.tile(128)


def test_the_kernel_facts_read_from_upstream() -> None:
    """The numbers as the sources say them (trtkv/data/kv_formats.json cites file and commit of each)."""
    modes = load_attention().modes
    fa3 = modes["vllm_fa3_fp8"]
    assert (fa3.prefill.p_scale, fa3.prefill.tile_order) == (256.0, "last_to_first")  # Max_offset 8; n_block down
    assert (fa3.prefill.tile(128), fa3.decode.tile(128)) == (192, 96)  # tile_size.h FP8, two-level accumulation
    assert (fa3.prefill.tile(64), fa3.decode.tile(64)) == (128, 128)
    assert fa3.prefill.tile(256, sliding=True) == 64
    trt = modes["trtllm_fp8_fmha_sm90"]
    assert (trt.prefill.p_scale, trt.decode.p_scale) == (256.0, 448.0)  # Softmax_fp_quant_scale; 1 / xScale
    assert (trt.prefill.tile(64), trt.prefill.tile(128), trt.decode.tile(128)) == (256, 128, 64)
    assert trt.prefill.q_scale == trt.decode.q_scale == "kv_scale"  # qkv_scale_orig_quant = kv_scale_orig_quant
    assert modes["sglang_fa3_fp8"].prefill.q_scale == "unit_cast"  # q.to(kv_cache_dtype)
    assert modes["trtllm_fresh_context"].prefill.kv == "fresh"
    # where prefill and decode differ (the probe records 0 without running the passes where they do not)
    assert fa3.drifts(128) and not fa3.drifts(64) and not fa3.drifts(256) and not fa3.drifts(256, sliding=True)
    assert trt.drifts(64) and trt.drifts(128) and trt.drifts(256)  # fmha_v2 x256 vs XQA x448 at every head_dim
    assert not modes["cache_only"].drifts(128)


@pytest.mark.parametrize(("recipe", "overrides", "mode"), [
    ("llama70b_fp8kv", [], "trtllm_fp8_fmha_sm90"),  # --use_fp8_context_fmha on (FP8 weights + FP8 KV), H100
    ("llama70b_fp8kv", ["hardware.gpu=L40S"], "trtllm_fp8_fmha"),
    ("llama70b_fp8kv", ["quantization.weights=none"], "trtllm_fresh_context_xqa_sm90"),
    ("llama70b_fp8kv", ["hardware.gpu=B200"], CACHE_ONLY),  # trtllm-gen cubins: not modelled
    ("llama70b_int8kv", [], "trtllm_fresh_context"),
    ("llama70b_fp8kv_llmapi", [], "trtllm_fp8_fmha_sm90"),
    ("llama70b_fp8kv_sglang", [], "sglang_fa3_fp8"),
    ("smollm2_fp8kv", [], CACHE_ONLY),  # the CPU reference runtime
    ("smollm2_fp8kv_vllm", ["hardware.gpu=H100-80GB"], "vllm_fa3_fp8"),
    ("smollm2_fp8kv_vllm", ["hardware.gpu=L40S"], CACHE_ONLY),  # SM89: FA2 / FlashInfer FA2 dequantize
])
def test_auto_follows_the_recipes_engine_flags_and_gpu(recipe: str, overrides: list[str], mode: str) -> None:
    r = load_recipe(recipe, overrides)
    got, why = recipe_mode(r)
    assert got == mode, why
    modes, reasons = resolve_modes(r, "auto")
    assert modes[0] == CACHE_ONLY and (mode == CACHE_ONLY or modes == [CACHE_ONLY, mode])
    if "B200" in " ".join(overrides):
        assert "Blackwell" in reasons[CACHE_ONLY]


def test_unknown_modes_are_refused_with_the_list() -> None:
    with pytest.raises(TrtkvError, match="unknown attention mode 'fa9'.*vllm_fa3_fp8"):
        resolve_modes(load_recipe("smollm2_fp8kv"), "cache_only,fa9")
    with pytest.raises(Exception, match="is not an attention mode"):
        load_recipe("smollm2_fp8kv", ["probe.attention=fa9"])
    assert select_mode("vllm", "none", (9, 0))[0] == CACHE_ONLY


def test_a_quantizing_kernel_without_a_source_is_refused() -> None:
    doc = json.loads(TABLE_PATH.read_text())
    bad = copy.deepcopy(doc)
    bad["attention"]["modes"]["vllm_fa3_fp8"]["decode"]["sources"] = []
    with pytest.raises(TrtkvError, match="upstream file and commit"):
        parse_attention(bad)
    bad = copy.deepcopy(doc)
    bad["attention"]["modes"]["vllm_fa3_fp8"]["decode"]["p"] = "fp4"
    with pytest.raises(TrtkvError, match="p 'fp4' is not one of"):
        parse_attention(bad)


def test_docs_table_lists_every_mode() -> None:
    text = table_markdown()
    assert all(f"**{name}**" in text for name in load_attention().modes)
