"""RoPE in its three spellings (transformers 5 rope_parameters, transformers 4 rope_theta/rope_scaling, TensorRT-LLM
rotary_base/rotary_scaling) and the checks that catch a checkpoint TensorRT-LLM would read with the wrong positions."""

from __future__ import annotations

from trtkv.checkpoints import rope

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}


def test_transformers5_llama3_becomes_trtllm_fields() -> None:
    source = {"rope_parameters": {**LLAMA3, "rope_theta": 500000.0}}
    fields = rope.trtllm_fields(rope.from_hf(source))
    assert fields["rotary_base"] == 500000.0
    # TensorRT-LLM reads rotary_scaling.get("type", rotary_scaling.get("rope_type")) and the llama3 keys
    assert fields["rotary_scaling"] == {"type": "llama3", **LLAMA3}


def test_plain_rope_has_no_scaling_in_any_spelling() -> None:
    for source in ({"rope_parameters": {"rope_type": "default", "rope_theta": 100000.0}},
                   {"rope_theta": 100000.0, "rope_scaling": None},
                   {"rope_theta": 100000.0, "rope_scaling": {"rope_type": "default"}}):
        r = rope.from_hf(source)
        assert r == rope.Rope(100000.0, None)
        assert rope.trtllm_fields(r) == {"rotary_base": 100000.0, "rotary_scaling": None}
        assert rope.hf_legacy_fields(r) == {"rope_theta": 100000.0, "rope_scaling": None}


def test_transformers4_spelling_is_read_too() -> None:
    r = rope.from_hf({"rope_theta": 500000.0, "rope_scaling": {**{k: v for k, v in LLAMA3.items() if k != "rope_type"},
                                                               "type": "llama3"}})
    assert r.theta == 500000.0 and r.scaling == LLAMA3


def test_trtllm_defaults_apply_when_keys_are_absent() -> None:
    assert rope.from_trtllm({}) == rope.Rope(rope.TRTLLM_DEFAULT_ROTARY_BASE, None)
    assert rope.TRTLLM_DEFAULT_ROTARY_BASE == 10000.0


def test_completed_configs_keep_what_was_there() -> None:
    source = {"rope_parameters": {**LLAMA3, "rope_theta": 500000.0}}
    trt = rope.complete_trtllm_config({"dtype": "bfloat16", "rotary_base": 10000.0}, source)
    assert trt["dtype"] == "bfloat16" and trt["rotary_base"] == 500000.0 and trt["rotary_scaling"]["type"] == "llama3"
    hf = rope.complete_hf_config({"rope_parameters": source["rope_parameters"], "hidden_size": 64}, source)
    assert hf["rope_theta"] == 500000.0 and hf["rope_scaling"]["rope_type"] == "llama3"
    assert hf["rope_parameters"] == source["rope_parameters"] and hf["hidden_size"] == 64
    assert rope.rope_problems(rope.from_hf(source), trt, hf) == []


def test_problems_name_the_missing_and_wrong_keys() -> None:
    model = rope.from_hf({"rope_parameters": {**LLAMA3, "rope_theta": 500000.0}})
    problems = rope.rope_problems(model, {"dtype": "bfloat16"}, {"rope_parameters": {}})
    assert len(problems) == 2
    assert "rotary_base and rotary_scaling absent" in problems[0] and "10000" in problems[0]
    assert "theta 500000" in problems[0] and "llama3" in problems[0]
    assert problems[1].startswith("hf/config.json") and "rope_theta absent" in problems[1]
    wrong = rope.rope_problems(model, {"rotary_base": 500000.0, "rotary_scaling": {"type": "linear", "factor": 8.0}},
                               None)
    assert len(wrong) == 1 and "linear" in wrong[0]
    factor = rope.rope_problems(model, rope.trtllm_fields(rope.Rope(500000.0, {**LLAMA3, "factor": 4.0})), None)
    assert len(factor) == 1 and "factor 4.0" in factor[0]
