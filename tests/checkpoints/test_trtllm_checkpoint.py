"""TensorRT-LLM checkpoint validation on synthetic checkpoints laid out as ModelOpt 0.47 writes them (no ModelOpt)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from trtkv.checkpoints.trtllm_checkpoint import validate_trtllm_checkpoint
from trtkv.core.errors import StageError
from trtkv.recipe import load_recipe

LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD, INTER, VOCAB = 4, 64, 4, 2, 16, 128, 256


def make_recipe(tmp_path: Path, kv: str = "int8", tp: int = 1, pp: int = 1):  # noqa: ANN201 - Recipe
    hardware = "{gpu: cpu, count: 1}" if tp * pp == 1 else f"{{gpu: H100-80GB, count: {tp * pp}}}"
    path = tmp_path / "ck.yaml"
    path.write_text(f"""\
model: {{source: /nowhere, dtype: bfloat16, num_layers: {LAYERS}, num_attention_heads: {HEADS},
        num_kv_heads: {KV_HEADS}, head_dim: {HEAD}, hidden_size: {HIDDEN}, vocab_size: {VOCAB}}}
quantization: {{weights: fp8, kv_cache: {kv}}}
build: {{backend: reference, tp_size: {tp}, pp_size: {pp}, max_input_len: 256, max_seq_len: 512}}
bench: {{needle_context_lengths: [192]}}
hardware: {hardware}
""")
    return load_recipe(path)


def write_checkpoint(folder: Path, kv: str | None = "INT8", tp: int = 1, pp: int = 1, factor: float = 0.05) -> Path:
    """config.json + rank files with ModelOpt's names, shapes and per-stage layer indices (kv None: no KV factors)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"architecture": "LlamaForCausalLM", "decoder": "llama", "dtype": "bfloat16",
              "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
              "hidden_size": HIDDEN, "head_size": HEAD, "intermediate_size": INTER, "vocab_size": VOCAB,
              "hidden_act": "silu", "use_parallel_embedding": True, "embedding_sharding_dim": 0,
              "share_embedding_table": False, "mapping": {"world_size": tp * pp, "tp_size": tp, "pp_size": pp},
              "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": kv, "exclude_modules": ["lm_head"]}}
    (folder / "config.json").write_text(json.dumps(config, indent=4))
    fp8, bf16 = torch.float8_e4m3fn, torch.bfloat16
    for rank in range(tp * pp):
        pp_rank = rank // tp
        tensors: dict[str, torch.Tensor] = {}
        for i in range(LAYERS // pp):
            p = f"transformer.layers.{i}."
            tensors.update({
                p + "input_layernorm.weight": torch.ones(HIDDEN, dtype=bf16),
                p + "post_layernorm.weight": torch.ones(HIDDEN, dtype=bf16),
                p + "attention.qkv.weight": torch.zeros((HEADS + 2 * KV_HEADS) * HEAD // tp, HIDDEN).to(fp8),
                p + "attention.dense.weight": torch.zeros(HIDDEN, HEADS * HEAD // tp).to(fp8),
                p + "mlp.fc.weight": torch.zeros(INTER // tp, HIDDEN).to(fp8),
                p + "mlp.gate.weight": torch.zeros(INTER // tp, HIDDEN).to(fp8),
                p + "mlp.proj.weight": torch.zeros(HIDDEN, INTER // tp).to(fp8),
                p + "attention.qkv.weights_scaling_factor": torch.tensor([1e-3]),
            })
            if kv is not None:
                tensors[p + "attention.kv_cache_scaling_factor"] = torch.tensor([factor * (1 + i + pp_rank * LAYERS // pp)])
        if pp_rank == 0:
            tensors["transformer.vocab_embedding.weight"] = torch.zeros(VOCAB // tp, HIDDEN, dtype=bf16)
        if pp_rank == pp - 1:
            tensors["transformer.ln_f.weight"] = torch.ones(HIDDEN, dtype=bf16)
            tensors["lm_head.weight"] = torch.zeros(VOCAB // tp, HIDDEN, dtype=bf16)
        save_file(tensors, str(folder / f"rank{rank}.safetensors"))
    return folder


def edit_rank(path: Path, drop: str | None = None, set_: dict[str, torch.Tensor] | None = None) -> None:
    tensors = load_file(str(path))
    if drop:
        del tensors[drop]
    tensors.update(set_ or {})
    save_file(tensors, str(path))


def edit_config(folder: Path, **changes: object) -> None:
    config = json.loads((folder / "config.json").read_text())
    for dotted, value in changes.items():
        node = config
        keys = dotted.split("__")
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value
    (folder / "config.json").write_text(json.dumps(config))


def problems(folder: Path, recipe) -> str:  # noqa: ANN001
    with pytest.raises(StageError) as info:
        validate_trtllm_checkpoint(folder, recipe)
    return str(info.value)


def test_valid_checkpoint_summary(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "ck")
    summary = validate_trtllm_checkpoint(folder, make_recipe(tmp_path))
    assert summary["kv_cache_quant_algo"] == "INT8" and summary["num_layers"] == LAYERS
    assert summary["kv_cache_scaling_factors"] == pytest.approx([0.05, 0.1, 0.15, 0.2])


@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2), (2, 2)])
def test_parallel_layouts(tmp_path: Path, tp: int, pp: int) -> None:
    folder = write_checkpoint(tmp_path / "ck", tp=tp, pp=pp)
    summary = validate_trtllm_checkpoint(folder, make_recipe(tmp_path, tp=tp, pp=pp))
    assert len(summary["ranks"]) == tp * pp
    assert summary["kv_cache_scaling_factors"] == pytest.approx([0.05, 0.1, 0.15, 0.2])  # global layer order


def test_missing_kv_factor_is_named(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "ck")
    edit_rank(folder / "rank0.safetensors", drop="transformer.layers.2.attention.kv_cache_scaling_factor")
    text = problems(folder, make_recipe(tmp_path))
    assert "rank0.safetensors: tensor transformer.layers.2.attention.kv_cache_scaling_factor is missing" in text


def test_missing_rank_and_weight(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "ck", tp=2)
    (folder / "rank1.safetensors").unlink()
    edit_rank(folder / "rank0.safetensors", drop="lm_head.weight")
    text = problems(folder, make_recipe(tmp_path, tp=2))
    assert "rank1.safetensors: missing" in text and "tensor lm_head.weight is missing" in text


def test_wrong_mapping_is_named(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "ck")
    edit_config(folder, mapping__tp_size=2, mapping__world_size=2)
    text = problems(folder, make_recipe(tmp_path))
    assert "mapping.tp_size = 2, but recipe build (tp_size) = 1" in text
    assert "mapping.world_size = 2" in text


def test_recipe_and_config_disagree(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "ck", kv="FP8")
    edit_config(folder, dtype="float16", num_key_value_heads=4)
    text = problems(folder, make_recipe(tmp_path, kv="int8"))
    assert "quantization.kv_cache_quant_algo = 'FP8', but recipe quantization.kv_cache = 'int8' needs 'INT8'" in text
    assert "dtype = 'float16'" in text and "num_key_value_heads = 4" in text


def test_bad_scale_and_shape(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "ck")
    edit_rank(folder / "rank0.safetensors", set_={
        "transformer.layers.1.attention.kv_cache_scaling_factor": torch.tensor([float("nan")]),
        "transformer.layers.0.attention.kv_cache_scaling_factor": torch.tensor([-1.0]),
        "transformer.layers.3.attention.dense.weight": torch.zeros(HIDDEN, 8).to(torch.float8_e4m3fn)})
    text = problems(folder, make_recipe(tmp_path))
    assert "layers.1.attention.kv_cache_scaling_factor holds [nan]" in text
    assert "layers.0.attention.kv_cache_scaling_factor holds [-1.0]" in text
    assert "layers.3.attention.dense.weight has shape [64, 8], expected [64, 64]" in text


def test_kv_scales_json_must_agree(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "ck")
    algo = json.loads((folder / "config.json").read_text())["quantization"]["kv_cache_quant_algo"]
    layers = [{"layer": i, "k_amax": 1.0, "v_amax": 1.0, "kv_cache_scaling_factor": 0.05 * (i + 1), "k_scale": 1.0,
               "v_scale": 1.0} for i in range(LAYERS)]
    layers[3]["kv_cache_scaling_factor"] = 9.0
    doc = {"kv_cache_quant_algo": algo, "num_layers": LAYERS, "convention": "x", "layers": layers}
    (folder / "kv_scales.json").write_text(json.dumps(doc))
    assert "layer 3: kv_cache_scaling_factor 9.0 differs" in problems(folder, make_recipe(tmp_path))
    (folder / "kv_scales.json").write_text(json.dumps({"layers": layers[:1]}))  # not the calibrate stage's format
    assert "kv_scales.json: not readable" in problems(folder, make_recipe(tmp_path))


def test_no_checkpoint(tmp_path: Path) -> None:
    assert "config.json: missing" in problems(tmp_path / "empty", make_recipe(tmp_path))


def test_unquantized_kv_checkpoint_is_valid_for_kv_none(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "ck", kv=None, tp=2)
    (folder / "kv_scales.json").write_text(json.dumps({"kv_cache_quant_algo": None, "num_layers": LAYERS,
                                                       "convention": "x", "layers": []}))
    summary = validate_trtllm_checkpoint(folder, make_recipe(tmp_path, kv="none", tp=2))
    assert summary["kv_cache_quant_algo"] is None and summary["kv_cache_scaling_factors"] == []
    assert summary["quant_algo"] == "FP8" and len(summary["ranks"]) == 2


def test_missing_factors_are_refused_unless_kv_none(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "ck", kv=None)
    edit_config(folder, quantization__kv_cache_quant_algo="FP8")  # claims FP8 KV but holds no factors
    text = problems(folder, make_recipe(tmp_path, kv="fp8"))
    for i in range(LAYERS):
        assert f"tensor transformer.layers.{i}.attention.kv_cache_scaling_factor is missing" in text
    edit_config(folder, quantization__kv_cache_quant_algo=None)
    text = problems(folder, make_recipe(tmp_path, kv="int8"))
    assert "kv_cache_quant_algo = None, but recipe quantization.kv_cache = 'int8' needs 'INT8'" in text


def test_kv_none_rejects_stray_factors_and_mismatched_json(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "ck")  # INT8 factors in every layer
    edit_config(folder, quantization__kv_cache_quant_algo=None)
    text = problems(folder, make_recipe(tmp_path, kv="none"))
    assert "layers [0, 1, 2, 3] hold attention.kv_cache_scaling_factor, but quantization.kv_cache_quant_algo is null" \
        in text
    clean = write_checkpoint(tmp_path / "clean", kv=None)
    (clean / "kv_scales.json").write_text(json.dumps({"kv_cache_quant_algo": "FP8", "num_layers": 4, "convention": "x",
                                                      "layers": []}))
    text = problems(clean, make_recipe(tmp_path, kv="none"))
    assert "kv_cache_quant_algo = 'FP8', but config.json quantization.kv_cache_quant_algo = None" in text
