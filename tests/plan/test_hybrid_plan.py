"""`trtkv init` + `trtkv plan` on the 2026 hybrids: the fixed state priced beside the attention KV (exact and vLLM's
allocation), the advice about what an 8-bit cache buys, the state dtype as an engine setting carried into vLLM's
command. Expected bytes are summed here from the config's own fields (tests/data/configs)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trtkv.backends import vllm_command
from trtkv.cli.init import write_recipe
from trtkv.core.errors import RecipeError
from trtkv.plan.planner import plan
from trtkv.recipe import load_recipe

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
GIB = 1024**3


def _cfg(name: str) -> dict:
    return json.loads((CONFIGS / name / "config.json").read_text())


def _gdn_state(c: dict, conv_bytes: int, ssm_bytes: int) -> int:
    conv = (2 * c["linear_num_key_heads"] * c["linear_key_head_dim"] + c["linear_num_value_heads"]
            * c["linear_value_head_dim"]) * (c["linear_conv_kernel_dim"] - 1)
    ssm = c["linear_num_value_heads"] * c["linear_value_head_dim"] * c["linear_key_head_dim"]
    return conv * conv_bytes + ssm * ssm_bytes


@pytest.fixture(scope="module")
def qwen3_next(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hybrid") / "q3n.yaml"
    write_recipe("q3n", CONFIGS / "qwen3_next_80b_a3b", path, "H200-141GB", count=2)
    return path


def test_exact_and_vllm_bytes_of_a_gated_deltanet_hybrid(qwen3_next: Path) -> None:
    c = _cfg("qwen3_next_80b_a3b")
    every, layers = c["full_attention_interval"], c["num_hidden_layers"]
    full = sum(1 for i in range(layers) if (i + 1) % every == 0)
    linear = layers - full
    recipe = load_recipe(qwen3_next, ["quantization.kv_cache=none"])
    p = plan(recipe)
    n = recipe.build.max_seq_len
    per_token = 2 * c["num_key_value_heads"] * c["head_dim"] * 2  # K and V, bf16, one full layer
    state = _gdn_state(c, 2, 2)  # bf16 conv and recurrent state (auto on a GPU)
    cap = next(x for x in p.formats if x.format == "fp16")
    assert cap.bytes_per_token == full * per_token  # per token: only the attention layers' KV
    assert cap.per_sequence_kv_bytes_by_accounting["exact"][n] == full * n * per_token + linear * state
    # vLLM: attention block raised so one page holds a state; 36 state layers in groups of the 12 attention layers
    block = 16 * math.ceil(state / (16 * per_token))
    groups = linear // full
    vllm_bytes = full * (math.ceil(n / block) + groups * 2) * block * per_token  # 2 state blocks: prefix caching
    assert cap.per_sequence_kv_bytes_by_accounting["vllm"][n] == vllm_bytes
    assert p.attention.state.vllm_attention_block == block and p.attention.kv_layers == full
    assert p.attention.state.bytes_per_sequence == linear * state


def test_advice_says_how_few_layers_hold_kv_and_what_8_bit_buys(qwen3_next: Path) -> None:
    p = plan(load_recipe(qwen3_next))
    text = " ".join(p.advice)
    assert "Only 12 of 48 layers hold a KV cache (1 in 4)" in text
    fp16 = next(x for x in p.formats if x.format == "fp16")
    fp8 = next(x for x in p.formats if x.format == "fp8")
    n = 32768
    ratio = fp16.per_sequence_kv_bytes_by_accounting["exact"][n] / fp8.per_sequence_kv_bytes_by_accounting["exact"][n]
    assert 1 < ratio < 2 and f"x{ratio:.2f} bytes per sequence" in text, text
    assert f"{fp16.max_sequences[n]:,} -> {fp8.max_sequences[n]:,} sequences per GPU" in text
    assert fp8.max_sequences[n] > fp16.max_sequences[n] > 0


def test_state_dtype_is_an_engine_setting_carried_into_vllms_command(qwen3_next: Path) -> None:
    c = _cfg("qwen3_next_80b_a3b")
    vllm_fp8 = ["build.backend=vllm", "quantization.weights=fp8"]  # vLLM loads ModelOpt's FP8 KV with FP8 weights
    base = plan(load_recipe(qwen3_next, vllm_fp8))
    wide = load_recipe(qwen3_next, [*vllm_fp8, "build.mamba_ssm_cache_dtype=float32"])
    p = plan(wide)
    assert base.attention.state.recurrent_dtype == "bfloat16"
    assert p.attention.state.recurrent_dtype == "float32"
    assert p.attention.state.bytes_per_layer == _gdn_state(c, 2, 4)
    args = vllm_command.server_args(wide, Path("/m"), "127.0.0.1")
    assert args[args.index("--mamba-ssm-cache-dtype") + 1] == "float32" and "--mamba-cache-dtype" not in args


def test_nemotron_h_state_defaults_to_float32_on_vllm(tmp_path: Path) -> None:
    path = tmp_path / "nh.yaml"
    write_recipe("nh", CONFIGS / "nemotron_nano_9b_v2", path, "A10G", kv_cache="none")
    p = plan(load_recipe(path, ["build.backend=vllm"]))  # kv_cache none: bf16 weights load in vLLM
    assert p.attention.state.recurrent_dtype == "float32"  # vLLM's NemotronHForCausalLMConfig default
    assert "float32" in " ".join(p.advice)


def test_a_recipe_listing_state_layers_without_their_shape_is_refused(qwen3_next: Path, tmp_path: Path) -> None:
    text = qwen3_next.read_text()
    kept = [line for line in text.splitlines() if not line.startswith("  state_layers:")]
    lines = [line.replace("source:", "source: \"org/elsewhere\"  # was") if line.startswith("  source:") else line
             for line in kept]
    bare = tmp_path / "q3n.yaml"
    bare.write_text("\n".join(lines) + "\n")
    with pytest.raises(RecipeError, match=r"model.state_layers.*linear/mamba layers.*trtkv init"):
        plan(load_recipe(bare))


def test_state_dtype_reaches_tensorrt_llms_kv_cache_config(qwen3_next: Path) -> None:
    from trtkv.backends import llmapi_args

    fields = json.loads((CONFIGS.parent / "llm_args_fields.json").read_text())["kv_cache_config"]
    kv = llmapi_args.llm_args(load_recipe(qwen3_next, ["build.mamba_ssm_cache_dtype=float32"]), Path("/m"))["kv_cache_config"]
    assert kv["mamba_ssm_cache_dtype"] == "float32" and "mamba_ssm_cache_dtype" in fields  # an upstream field
    assert "mamba_ssm_cache_dtype" not in llmapi_args.llm_args(load_recipe(qwen3_next), Path("/m"))["kv_cache_config"]
