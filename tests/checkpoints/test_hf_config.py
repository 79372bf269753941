"""config.json -> per-layer attention facts, for each family's published config (tests/data/configs, see its README)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtkv.checkpoints import count_parameters, read_model_facts
from trtkv.checkpoints.hf_config_fields import ModelConfigError
from trtkv.recipe.attention import AttentionKind, LayerAttention

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def raw(name: str) -> dict:
    data = json.loads((CONFIGS / name / "config.json").read_text())
    return data.get("text_config", data)


def kinds(name: str) -> list[tuple[str, int | None]]:
    return [(x.kind.value, x.window) for x in read_model_facts(CONFIGS / name).layers]


def test_dense_models_are_full_attention_and_qwen_use_sliding_window_false_wins() -> None:
    for name in ("llama3_1_8b", "qwen3_8b", "qwen2_5_7b", "qwen3_30b_a3b"):
        cfg = raw(name)
        assert kinds(name) == [("full", None)] * cfg["num_hidden_layers"], name
    # Qwen2.5 sets sliding_window 131072 and max_window_layers 28, but use_sliding_window false
    assert "use_sliding_window false" in read_model_facts(CONFIGS / "qwen2_5_7b").attention_source


def test_qwen2_with_sliding_window_on_slides_from_max_window_layers() -> None:
    cfg = raw("qwen2_sliding_tiny")
    expected = [("sliding", cfg["sliding_window"]) if i >= cfg["max_window_layers"] else ("full", None)
                for i in range(cfg["num_hidden_layers"])]
    assert kinds("qwen2_sliding_tiny") == expected


def test_mistral_single_window_and_per_layer_list() -> None:
    cfg = raw("mistral_7b_v0_1")
    assert kinds("mistral_7b_v0_1") == [("sliding", cfg["sliding_window"])] * cfg["num_hidden_layers"]
    cfg = raw("mistral_list_tiny")
    windows = cfg["sliding_window"]
    expected = [("full", None) if windows[i % len(windows)] >= cfg["max_position_embeddings"] else
                ("sliding", windows[i % len(windows)]) for i in range(cfg["num_hidden_layers"])]
    assert kinds("mistral_list_tiny") == expected and ("full", None) in expected


def test_gemma_patterns_layer_types_and_text_config() -> None:
    g2 = raw("gemma2_9b")
    assert kinds("gemma2_9b") == [("sliding", g2["sliding_window"]) if i % 2 == 0 else ("full", None)
                                  for i in range(g2["num_hidden_layers"])]
    g3 = raw("gemma3_27b")  # multimodal: the facts come from text_config
    pattern = g3["sliding_window_pattern"]
    assert kinds("gemma3_27b") == [("full", None) if (i + 1) % pattern == 0 else ("sliding", g3["sliding_window"])
                                   for i in range(g3["num_hidden_layers"])]
    facts = read_model_facts(CONFIGS / "gemma3_27b")
    assert facts.prefix == "text_config." and facts.tie_word_embeddings  # Gemma ties by default
    oss = raw("gpt_oss_120b")
    assert kinds("gpt_oss_120b") == [("sliding" if t == "sliding_attention" else "full",
                                      oss["sliding_window"] if t == "sliding_attention" else None)
                                     for t in oss["layer_types"]]
    assert "no KV cost" in (read_model_facts(CONFIGS / "gpt_oss_120b").sinks or "")


def test_llama4_chunked_local_from_no_rope_layers() -> None:
    cfg = raw("llama4_tiny_explicit")
    assert kinds("llama4_tiny_explicit") == [("chunked", cfg["attention_chunk_size"]) if r else ("full", None)
                                             for r in cfg["no_rope_layers"]]
    scout = raw("llama4_scout")  # empty no_rope_layers: transformers' default, every 4th layer global NoPE
    got = kinds("llama4_scout")
    assert got.count(("full", None)) == scout["num_hidden_layers"] // 4
    assert got.count(("chunked", scout["attention_chunk_size"])) == scout["num_hidden_layers"] * 3 // 4


@pytest.mark.parametrize("name", ["deepseek_v2", "deepseek_v3", "kimi_k2"])
def test_mla_models(name: str) -> None:
    cfg = raw(name)
    facts = read_model_facts(CONFIGS / name)
    assert facts.layers == (LayerAttention(AttentionKind.MLA),) * cfg["num_hidden_layers"]
    assert facts.head_dim == cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]  # not hidden // heads
    assert facts.moe is not None and facts.moe.moe_layers == tuple(range(cfg["first_k_dense_replace"],
                                                                         cfg["num_hidden_layers"]))


def test_parameters_counted_from_shapes() -> None:
    # published totals: DeepSeek-V3 671B, gpt-oss-120b 116.8B, Qwen3-30B-A3B 30.5B (3.3B active), Llama-3.1-8B 8.0B
    for name, total, tol in (("deepseek_v3", 671e9, 0.01), ("gpt_oss_120b", 116.8e9, 0.01),
                             ("qwen3_30b_a3b", 30.5e9, 0.01), ("llama3_1_8b", 8.03e9, 0.01)):
        assert count_parameters(read_model_facts(CONFIGS / name)).total == pytest.approx(total, rel=tol), name
    qwen = count_parameters(read_model_facts(CONFIGS / "qwen3_30b_a3b"))
    assert qwen.active_per_token == pytest.approx(3.3e9, rel=0.05)


@pytest.mark.parametrize("name, word", [("mamba2", "Mamba-2"), ("linear_layer_types", "mamba")])
def test_unpriced_state_space_families_refused_by_name(name: str, word: str) -> None:
    with pytest.raises(ModelConfigError, match=word) as exc:
        read_model_facts(CONFIGS / "refused" / name)
    assert "Next:" in str(exc.value)


@pytest.mark.parametrize("name, missing", [
    ("qwen3_next", "linear_num_key_heads, linear_num_value_heads, linear_key_head_dim, linear_value_head_dim, "
                   "linear_conv_kernel_dim"),
    ("nemotron_h", "mamba_num_heads, mamba_head_dim, n_groups, ssm_state_size, conv_kernel")])
def test_a_hybrid_without_its_state_fields_is_refused_naming_them(name: str, missing: str) -> None:
    """Qwen3-Next and Nemotron-H are priced (tests/checkpoints/test_hybrid_config.py); a config that lacks the dims of
    their state is refused by model_type with the fields that are missing."""
    with pytest.raises(ModelConfigError, match=rf"{name}.*needs {missing}.*Next:"):
        read_model_facts(CONFIGS / "refused" / name)


def test_unreadable_configs_name_the_field_and_the_next_step(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "num_attention_heads": 8}))
    with pytest.raises(ModelConfigError, match=r"num_hidden_layers: missing.*Next:"):
        read_model_facts(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelConfigError, match="not readable JSON"):
        read_model_facts(tmp_path / "config.json")
    with pytest.raises(ModelConfigError, match="no such file"):
        read_model_facts(tmp_path / "absent")
