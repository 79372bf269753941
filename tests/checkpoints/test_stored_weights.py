"""Stored bytes per tensor group: read from the safetensors headers where the folder holds the weights, estimated
from config.json where it holds only the config. For the MXFP4 (gpt-oss) and FP8 block (Qwen3 / DeepSeek) layouts
as published, the headers and the estimate agree group by group once the tensors the estimate leaves out (norms,
biases, sinks) are taken off: the estimate's bytes per weight are the layouts' own."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.quantized_checkpoints import gpt_oss_mxfp4, qwen3_moe_fp8_block
from trtkv.checkpoints import count_parameters, read_model_facts, stored_note, stored_weight_bytes
from trtkv.checkpoints.safetensors_headers import read_tensors
from trtkv.checkpoints.stored_weights import estimated_bytes, stored_bytes, tensor_group

LEFT_OUT = ("norm.weight", ".bias", "_bias", ".sinks")  # what the parameter count leaves out (< 0.1%)


@pytest.mark.parametrize(("name", "group"), [
    ("model.layers.3.mlp.experts.17.down_proj.weight", "experts"),
    ("model.layers.0.block_sparse_moe.experts.2.w1.weight", "experts"),
    ("model.layers.0.mlp.experts.gate_up_proj_blocks", "experts"),
    ("model.layers.0.mlp.shared_experts.down_proj.weight", "other"),
    ("model.layers.0.mlp.gate.weight", "other"),
    ("model.layers.5.self_attn.k_proj.k_scale", "attention"),
    ("model.layers.5.self_attn.kv_b_proj.weight_scale_inv", "attention"),
    ("model.embed_tokens.weight", "embeddings"),
    ("lm_head.weight", "embeddings"),
    ("model.norm.weight", "other"),
])
def test_tensor_groups(name: str, group: str) -> None:
    assert tensor_group(name) == group


@pytest.mark.parametrize(("build", "fmt", "stored_dtypes"), [
    (gpt_oss_mxfp4, "mxfp4", {"experts": ("BF16", "U8"), "attention": ("BF16",), "embeddings": ("BF16",)}),
    (qwen3_moe_fp8_block, "fp8_block", {"experts": ("F32", "F8_E4M3"), "attention": ("BF16", "F32", "F8_E4M3"),
                                        "embeddings": ("BF16",), "other": ("BF16",)}),
])
def test_published_layouts_priced_from_headers_agree_with_the_estimate(tmp_path: Path, build, fmt: str,
                                                                       stored_dtypes: dict) -> None:
    folder = build(tmp_path / "ckpt")
    facts = read_model_facts(folder)
    assert facts.quant is not None and facts.quant.formats["experts"] == fmt
    count = count_parameters(facts)
    stored = stored_bytes(facts, count, 2.0)
    assert not stored.estimate and "safetensors headers" in stored.source
    for group, dtypes in stored_dtypes.items():
        assert stored.dtypes[group] == dtypes, group
    entries = read_tensors(folder)
    assert stored.total == sum(e.nbytes for e in entries) == stored_weight_bytes(facts, count, 2.0)
    estimate = estimated_bytes(facts, count, 2.0)
    for group, stored_group in stored.groups.items():
        left_out = sum(e.nbytes for e in entries if tensor_group(e.name) == group and e.name.endswith(LEFT_OUT))
        assert stored_group - left_out == pytest.approx(estimate.groups[group], rel=1e-12), group
    # the same config without its weights: an estimate, said so, and the planner's formula
    alone = tmp_path / "config_only"
    alone.mkdir()
    shutil.copy(folder / "config.json", alone / "config.json")
    bare = read_model_facts(alone)
    estimated = stored_bytes(bare, count, 2.0)
    assert estimated.estimate and "estimate from" in estimated.source and "no weights" in estimated.source
    assert estimated.groups == estimate.groups
    assert stored_weight_bytes(bare, count, 2.0) == pytest.approx(estimate.total, rel=0.01)
    # the plan's note says which
    assert "safetensors headers of" in str(stored_note(facts, count, 2.0))
    assert f"experts {fmt}" in str(stored_note(facts, count, 2.0))
    assert "an estimate from config.json alone" in str(stored_note(bare, count, 2.0))
