"""Issue 51: every stored format word `trtkv init` records (model.checkpoint_quant: StoredQuant.stored_format) has a
size in trtkv.recipe.stored.STORED_BITS, so a re-quantization is refused for being no smaller, not as "of unknown size"
(on main the compressed-tensors W4A16 export's word int4 and GPTQ's int4_gptq / int8_gptq had none)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.quantized_checkpoints import compressed_tensors_checkpoint, modelopt_checkpoint
from trtkv.checkpoints import read_model_facts
from trtkv.checkpoints.checkpoint_quant import MODELOPT_ALGOS, UNQUANTIZED, read_checkpoint_quant
from trtkv.cli.init import write_recipe
from trtkv.core.errors import RecipeError
from trtkv.recipe import load_recipe
from trtkv.recipe.stored import STORED_BITS

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def _ct(num_bits: int, kind: str, strategy: str, **extra: object) -> dict:
    weights = {"num_bits": num_bits, "type": kind, "strategy": strategy, **extra}
    return {"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": weights}}}


CONFIGS_BY_WORD = {
    # compressed-tensors as llm-compressor's presets write them
    "fp8": _ct(8, "float", "channel"),
    "fp8_block": _ct(8, "float", "block", block_structure=[128, 128]),
    "nvfp4": _ct(4, "float", "tensor_group", group_size=16),
    "int4": _ct(4, "int", "group", group_size=128),  # W4A16
    "int8": _ct(8, "int", "channel"),  # W8A8
    # the quant_method configs
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 128},
    "gptq": {"quant_method": "gptq", "bits": 8, "group_size": 128},
    "mxfp4": {"quant_method": "mxfp4"},
    **{f"modelopt {algo}": {"quant_method": "modelopt", "quant_algo": algo} for algo in MODELOPT_ALGOS},
}


@pytest.mark.parametrize("word", list(CONFIGS_BY_WORD))
def test_every_word_the_reader_gives_has_a_size(word: str) -> None:
    notes: list[str] = []
    quant = read_checkpoint_quant(CONFIGS_BY_WORD[word], None, notes)
    assert quant is not None and notes == []
    words = {quant.stored_format, *quant.formats.values()} - {UNQUANTIZED}
    assert words and all(w in STORED_BITS for w in words), (words, quant)


@pytest.fixture(scope="module")
def llmapi_recipe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("stored") / "g.yaml"
    return write_recipe("g", CONFIGS / "gpt_oss_120b", out, "H200-141GB", backend="llmapi", warn=lambda _line: None)


def _refusal(recipe: Path, stored: str, weights: str) -> str:
    with pytest.raises(RecipeError) as err:
        load_recipe(recipe, [f"model.checkpoint_quant={stored}", f"quantization.weights={weights}"])
    return str(err.value)


def test_the_fixtures_int4_exports_are_refused_as_4_bit_not_of_unknown_size(smollm2_dir: Path,
                                                                          llmapi_recipe: Path) -> None:
    """The words init records for the fixtures (ModelOpt's own INT4 AWQ export and the compressed-tensors library's
    W4A16, built from SmolLM2's first layers): re-quantizing them to int4_awq or fp8 is refused as not smaller."""
    folders = {"modelopt int4_awq": modelopt_checkpoint("int4_awq", smollm2_dir)}
    w4a16 = compressed_tensors_checkpoint("W4A16", smollm2_dir)
    if w4a16 is not None:  # needs vLLM's side venv, which ships compressed-tensors
        folders["compressed-tensors W4A16"] = w4a16
    words = {}
    for name, folder in folders.items():
        quant = read_model_facts(folder).quant
        assert quant is not None and quant.stored_format is not None, name
        words[name] = quant.stored_format
        for weights in ("int4_awq", "fp8"):
            text = _refusal(llmapi_recipe, quant.stored_format, weights)
            assert f"{weights} on a checkpoint stored as {quant.stored_format} (4-bit" in text, text
            assert "unknown size" not in text
    assert words.get("compressed-tensors W4A16", "int4") == "int4" and words["modelopt int4_awq"] == "int4_awq"


@pytest.mark.parametrize(("stored", "bits"), [("int4_gptq", 4), ("int8_gptq", 8), ("int4", 4), ("mxfp8", 8)])
def test_gptq_and_int_words_are_sized(llmapi_recipe: Path, stored: str, bits: int) -> None:
    text = _refusal(llmapi_recipe, stored, "fp8")
    assert f"stored as {stored} ({bits}-bit" in text
    if bits == 8:  # a smaller format may still replace an 8-bit one
        load_recipe(llmapi_recipe, [f"model.checkpoint_quant={stored}", "quantization.weights=int4_awq"])
