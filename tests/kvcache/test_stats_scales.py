"""K/V statistics and static scales (kv_scales.json, trtkv.contracts.artifacts.KVScalesFile) on a tiny random Llama."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from trtkv.core.errors import StageError
from trtkv.kvcache.scales import KVScales, calibration_batches, f32, kv_scales_document, load_kv_scales
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
    doc = kv_scales_document("FP8", s.k_amax, s.v_amax, source=s.source).document()
    assert doc["layers"][0]["kv_cache_scaling_factor"] == 1.0  # ModelOpt clamps FP8 to >= 1.0
    assert doc["layers"][0]["k_scale"] == f32(10 / 448)  # float32, as the checkpoint stores it
    assert kv_scales_document("INT8", s.k_amax, s.v_amax).document()["layers"][1]["kv_cache_scaling_factor"] == f32(4 / 127)
    assert s.to_probe_json() == {"source": "test", "layers": [{"layer": 0, "k_amax": 10.0, "v_amax": 0.5},
                                                             {"layer": 1, "k_amax": 2.0, "v_amax": 4.0}]}


def test_one_batch_builder_joins_records_with_eos() -> None:
    """calibrate and probe share calibration_batches: records in a seeded order, each followed by the EOS id."""

    class Tok:
        eos_token_id = 0

        def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
            return {"input_ids": [ord(c) for c in text]}

    batches = calibration_batches(Tok(), ["ab", "cd", "ef"], num_samples=3, seq_len=3, batch_size=2, seed=1)
    flat = [int(x) for b in batches for x in b.flatten()]
    assert [b.shape[0] for b in batches] == [2, 1] and flat.count(0) == 3  # three records, three separators
    again = calibration_batches(Tok(), ["ab", "cd", "ef"], 3, 3, 2, 1)
    assert all(torch.equal(a, b) for a, b in zip(batches, again, strict=True))  # same seed, same tokens
    with pytest.raises(StageError, match="num_samples x seq_len = 4 x 3 = 12"):
        calibration_batches(Tok(), ["ab", "cd", "ef"], num_samples=4, seq_len=3, batch_size=2, seed=1)


def test_load_kv_scales_contract(tmp_path: Path) -> None:
    path = tmp_path / "kv_scales.json"
    kv_scales_document("INT8", [3.0, 1.0], [0.5, 2.0], source="x").save(tmp_path)
    loaded = load_kv_scales(path, num_layers=2)
    assert loaded.k_amax == [3.0, 1.0] and loaded.v_amax == [0.5, 2.0]
    with pytest.raises(StageError, match="2 layers of scales for a model with 30"):
        load_kv_scales(path, num_layers=30)
    path.write_text("{}")
    with pytest.raises(StageError, match="no \"layers\" list"):
        load_kv_scales(path)
