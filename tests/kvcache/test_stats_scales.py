"""K/V statistics and static scales (contract 1 kv_scales.json) on a tiny random Llama."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from trtkv.errors import StageError
from trtkv.kvcache.scales import KVScales, load_kv_scales
from trtkv.kvcache.stats import collect_kv_stats


@pytest.fixture(scope="module")
def tiny() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=64)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # plant an outlier channel in layer 1's K projection (dim 5, both RoPE halves untouched)
        model.model.layers[1].self_attn.k_proj.weight[5] *= 40
    return model


def test_collect_kv_stats_finds_outlier_channel(tiny: LlamaForCausalLM) -> None:
    batches = [torch.randint(0, 64, (2, 48), generator=torch.Generator().manual_seed(i)) for i in range(2)]
    stats = collect_kv_stats(tiny, batches)
    assert stats.tokens == 192 and len(stats.layers) == 3 and stats.kv_heads == 1 and stats.head_dim == 64
    layer1 = stats.layers[1]
    assert layer1.k_outlier_channels and all(c in (5, 37) for c in layer1.k_outlier_channels)  # RoPE pairs 5 and 37
    assert layer1.k_tensor_to_channel_ratio > 4
    assert stats.layers[1].k_amax == max(stats.k_amax)
    doc = json.loads(stats.to_json())
    assert doc["summary"]["layers"] == 3 and len(doc["layers"]) == 3
    md = stats.to_markdown()
    assert "| layer |" in md and md.count("\n| ") >= 4


def test_scales_per_format_follow_runtime_conventions() -> None:
    s = KVScales(k_amax=[10.0, 2.0], v_amax=[0.5, 4.0], source="test")
    k, v = s.for_format("fp8")
    assert k == [10 / 448, 2 / 448] and v == [0.5 / 448, 4 / 448]
    k, v = s.for_format("int8")
    assert k == v == [10 / 127, 4 / 127]  # TensorRT-LLM: one scale shared by K and V
    k, v = s.for_format("int8_split")
    assert k == [10 / 127, 2 / 127] and v == [0.5 / 127, 4 / 127]
    assert s.for_format("int8_token") == (None, None)
    doc = s.to_kv_scales_json("FP8")
    assert doc["layers"][0]["kv_cache_scaling_factor"] == 1.0  # ModelOpt clamps FP8 to >= 1.0
    assert doc["layers"][0]["k_scale"] == 10 / 448
    assert s.to_kv_scales_json("INT8")["layers"][1]["kv_cache_scaling_factor"] == 4 / 127


def test_load_kv_scales_contract(tmp_path: Path) -> None:
    path = tmp_path / "kv_scales.json"
    path.write_text(json.dumps(KVScales([3.0, 1.0], [0.5, 2.0], "x").to_kv_scales_json("INT8")))
    loaded = load_kv_scales(path, num_layers=2)
    assert loaded.k_amax == [3.0, 1.0] and loaded.v_amax == [0.5, 2.0]
    with pytest.raises(StageError, match="2 layers of scales for a model with 30"):
        load_kv_scales(path, num_layers=30)
    path.write_text("{}")
    with pytest.raises(StageError, match="no \"layers\" list"):
        load_kv_scales(path)
