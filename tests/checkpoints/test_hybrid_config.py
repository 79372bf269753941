"""The 2026 hybrids read from config.json (tests/data/configs, see its README): which layers keep a fixed state, its
shape from the config's own dims, parameters against the published totals, Gemma 4's per-layer geometry. Expected
figures are derived here from each file's fields, not typed in."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trtkv.checkpoints import count_parameters, read_model_facts
from trtkv.engines.sequence import sequence_kv_bytes
from trtkv.engines.vllm_blocks import hybrid_block_size
from trtkv.kvcache.formats import KVFormat
from trtkv.recipe.attention import Accounting, AttentionKind, KVShape, LayerAttention
from trtkv.recipe.state import StateKind

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def raw(name: str) -> dict:
    data = json.loads((CONFIGS / name / "config.json").read_text())
    return data.get("text_config", data)


def test_qwen3_next_gated_deltanet_every_layer_but_each_fourth() -> None:
    cfg = raw("qwen3_next_80b_a3b")
    f = read_model_facts(CONFIGS / "qwen3_next_80b_a3b")
    every = cfg["full_attention_interval"]
    assert [x.kind for x in f.layers] == [AttentionKind.FULL if (i + 1) % every == 0 else AttentionKind.LINEAR
                                          for i in range(cfg["num_hidden_layers"])]
    s = f.state
    assert s is not None and s.kind is StateKind.GATED_DELTANET
    kh, vh, kd, vd = (cfg["linear_num_key_heads"], cfg["linear_num_value_heads"], cfg["linear_key_head_dim"],
                      cfg["linear_value_head_dim"])
    assert s.conv_elements() == (2 * kh * kd + vh * vd) * (cfg["linear_conv_kernel_dim"] - 1)
    assert s.recurrent_elements() == vh * vd * kd and s.recurrent_elements(tp=4) == vh // 4 * vd * kd
    count = count_parameters(f)  # published: 80B total, 3B activated (A3B)
    assert count.total == pytest.approx(80e9, rel=0.01)
    assert count.active_per_token - count.embedding == pytest.approx(3e9, rel=0.1)


def test_nemotron_h_pattern_mamba2_state_and_vllms_published_block_size() -> None:
    cfg = raw("nemotron_nano_9b_v2")
    f = read_model_facts(CONFIGS / "nemotron_nano_9b_v2")
    kinds = [x.kind for x in f.layers]
    # 27 Mamba, 25 MLP, 4 attention layers (NVIDIA-AI-IOT/jetson-generative-ai-playground, nemotron-nano-9b-v2.md)
    assert (kinds.count(AttentionKind.MAMBA), kinds.count(AttentionKind.NONE), kinds.count(AttentionKind.FULL)) == \
        (27, 25, 4)
    assert kinds == [{"M": AttentionKind.MAMBA, "-": AttentionKind.NONE, "*": AttentionKind.FULL}[c]
                     for c in cfg["hybrid_override_pattern"]]
    s = f.state
    assert s is not None and s.kind is StateKind.MAMBA2
    inter = cfg["mamba_num_heads"] * cfg["mamba_head_dim"]
    assert s.conv_dim == inter + 2 * cfg["n_groups"] * cfg["ssm_state_size"]
    assert s.recurrent_elements() == inter * cfg["ssm_state_size"]
    assert count_parameters(f).total == pytest.approx(8.89e9, rel=0.01)  # published: 8.89B
    # vllm-project/vllm#24280 (2025-09): "large attention page sizes (672 tokens for nvidia/NVIDIA-Nemotron-Nano-9B-v2)"
    # -- vLLM then kept the SSM state in the model dtype (bf16); 0.32 defaults Nemotron-H to float32
    attn = 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * 2
    assert hybrid_block_size(16, [attn], [s.bytes(2, 2)]) == 672
    assert hybrid_block_size(16, [attn], [s.bytes(2, 4)]) == 16 * math.ceil(s.bytes(2, 4) / (16 * attn))


def test_jamba_attention_every_eighth_layer_mamba1_state() -> None:
    cfg = raw("jamba_v0_1")
    f = read_model_facts(CONFIGS / "jamba_v0_1")
    period, offset = cfg["attn_layer_period"], cfg["attn_layer_offset"]
    assert [i for i, x in enumerate(f.layers) if x.kind is AttentionKind.FULL] == \
        [i for i in range(cfg["num_hidden_layers"]) if i % period == offset]
    s = f.state
    inter = cfg["mamba_expand"] * cfg["hidden_size"]
    assert s is not None and s.kind is StateKind.MAMBA1
    assert (s.conv_elements(), s.recurrent_elements()) == (inter * (cfg["mamba_d_conv"] - 1),
                                                            inter * cfg["mamba_d_state"])
    assert f.moe is not None and f.moe.moe_layers == tuple(range(1, cfg["num_hidden_layers"], 2))
    count = count_parameters(f)  # published: 52B total, 12B active
    assert count.total == pytest.approx(52e9, rel=0.015) and count.active_per_token == pytest.approx(12e9, rel=0.02)


def test_qwen3_5_reads_text_config_and_granite_legacy_layer_words() -> None:
    q = raw("qwen3_5_tiny")
    f = read_model_facts(CONFIGS / "qwen3_5_tiny")
    assert f.prefix == "text_config." and [x.kind.value for x in f.layers] == \
        ["linear" if t == "linear_attention" else "full" for t in q["layer_types"]]
    assert f.state is not None and f.state.rows == q["linear_num_value_heads"]
    g = raw("granite4_tiny")
    f = read_model_facts(CONFIGS / "granite4_tiny")
    assert [x.kind.value for x in f.layers] == ["mamba" if t == "mamba" else "full" for t in g["layer_types"]]
    s, inter = f.state, g["mamba_expand"] * g["hidden_size"]
    assert s is not None and s.row_elements == inter // g["mamba_n_heads"] * g["mamba_d_state"]  # d_head "auto"
    # TP 2 does not divide 1 group: vLLM replicates it on each rank (extra_groups_for_head_shards)
    tp, groups, ds = 2, g["mamba_n_groups"], g["mamba_d_state"]
    assert s.conv_elements(tp) == (inter + 2 * (groups + tp - groups) * ds) // tp * (g["mamba_d_conv"] - 1)


def test_gemma4_global_layer_geometry_and_kv_shared_layers() -> None:
    g = raw("gemma4_tiny")
    f = read_model_facts(CONFIGS / "gemma4_tiny")
    shared_from = g["num_hidden_layers"] - g["num_kv_shared_layers"]
    want = [LayerAttention(AttentionKind.NONE) if i >= shared_from else
            LayerAttention(AttentionKind.SLIDING, g["sliding_window"]) if t == "sliding_attention" else
            LayerAttention(AttentionKind.FULL, None, g["num_global_key_value_heads"], g["global_head_dim"])
            for i, t in enumerate(g["layer_types"])]
    assert list(f.layers) == want
    shape = KVShape(f.num_kv_heads, f.head_dim)
    n = 32768
    fmts = [KVFormat.BF16] * len(want)
    exact = sum(x.tokens_held(n) * 2 * (x.kv_heads or g["num_key_value_heads"]) * (x.head_dim or g["head_dim"]) * 2
                for x in want)
    assert sequence_kv_bytes(f.layers, shape, fmts, n) == exact
    # vLLM: the global layers' page (1 KV head x 128) is half the sliding page (4 x 64 ... x 2): their block doubles
    sliding_page = 16 * 2 * g["num_key_value_heads"] * g["head_dim"] * 2
    full_page = 16 * 2 * g["num_global_key_value_heads"] * g["global_head_dim"] * 2
    ratio = sliding_page // full_page
    sliding_blocks = math.ceil(min(g["sliding_window"] - 1 + 8192, n) / 16) + 1
    full_blocks = math.ceil(n / (16 * ratio))
    n_sliding = sum(1 for x in want if x.kind is AttentionKind.SLIDING)
    group = 1  # smallest spec count (1 full layer); the sliding spec is 6 groups of 1
    vllm = (n_sliding * sliding_blocks + group * full_blocks) * sliding_page
    assert sequence_kv_bytes(f.layers, shape, fmts, n, accounting=Accounting.VLLM) == vllm
