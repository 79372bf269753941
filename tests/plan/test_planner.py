"""The planner against published figures and its own formulas."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trtkv.kvcache.formats import KVFormat, bytes_per_element, kv_bytes_per_token
from trtkv.plan.planner import plan
from trtkv.recipe import load_recipe
from trtkv.units import GIB


def test_llama70b_published_bytes_per_token() -> None:
    assert kv_bytes_per_token(80, 8, 128, KVFormat.FP16) == 327_680
    assert kv_bytes_per_token(80, 8, 128, KVFormat.FP8) == 163_840
    assert kv_bytes_per_token(80, 8, 128, KVFormat.INT8) == 163_840
    assert kv_bytes_per_token(32, 8, 128, KVFormat.FP16) == 131_072  # Llama-3-8B


def test_scale_overheads() -> None:
    assert bytes_per_element(KVFormat.INT8_TOKEN, 128) == pytest.approx(1 + 2 / 128)
    assert bytes_per_element(KVFormat.INT4_G32, 128) == pytest.approx(0.5 + 4 / 32)
    assert bytes_per_element(KVFormat.INT4_G128, 128) == pytest.approx(0.5 + 4 / 128)
    assert bytes_per_element(KVFormat.KIVI2, 128) == pytest.approx(0.25 + 4 / 32)


def test_plan_json_has_known_figures(capsys: pytest.CaptureFixture[str]) -> None:
    from trtkv.cli import main

    assert main(["plan", "llama70b_fp8kv", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    fmts = {f["format"]: f for f in data["formats"]}
    assert fmts["fp16"]["bytes_per_token"] == 327_680
    assert fmts["fp8"]["bytes_per_token"] == 163_840
    example = next(e for e in data["examples"] if e["context_len"] == 32768 and e["batch"] == 8)
    assert example["fp16_gib"] == 80.0
    assert example["fp8_gib"] == 40.0
    assert data["recipe_kv_format"] == "fp8"
    assert data["hardware"]["tp_size"] == 4


def test_capacity_follows_budget_and_tp() -> None:
    recipe = load_recipe("llama70b_fp8kv")
    p = plan(recipe)
    fp8 = next(f for f in p.formats if f.format == "fp8")
    # TP4 splits the 8 KV heads: a quarter of the bytes per GPU
    assert fp8.bytes_per_token_per_gpu == fp8.bytes_per_token / 4
    assert fp8.tokens_per_gpu_budget == math.floor(p.kv_budget_gib_per_gpu * GIB / fp8.bytes_per_token_per_gpu)
    assert fp8.max_sequences[32768] == fp8.tokens_per_gpu_budget // 32768
    fp16 = next(f for f in p.formats if f.format == "fp16")
    assert fp8.tokens_per_gpu_budget == pytest.approx(2 * fp16.tokens_per_gpu_budget, abs=2)
    # a bigger GPU gives more room; a smaller memory fraction gives less
    bigger = plan(load_recipe("llama70b_fp8kv", ["hardware.gpu=H200-141GB"]))
    assert bigger.kv_budget_gib_per_gpu > p.kv_budget_gib_per_gpu
    less = plan(load_recipe("llama70b_fp8kv", ["triton.kv_cache_free_gpu_mem_fraction=0.45"]))
    # the engine path's pool is the fraction of what is free, in whole blocks of tokens_per_block tokens
    block_gib = recipe.build.tokens_per_block * fp8.bytes_per_token_per_gpu / GIB
    assert less.kv_budget_gib_per_gpu == pytest.approx(p.kv_budget_gib_per_gpu / 2, abs=block_gib)


def test_kv_heads_replicate_when_tp_exceeds_them() -> None:
    recipe = load_recipe("llama70b_fp8kv", ["build.tp_size=8", "hardware.count=8"])
    fp16 = next(f for f in plan(recipe).formats if f.format == "fp16")
    assert fp16.bytes_per_token_per_gpu == 2 * 80 * 1 * 128 * 2  # one KV head per GPU


def test_decode_bound_uses_bandwidth() -> None:
    p = plan(load_recipe("llama8b_fp8kv"))
    fp8 = next(f for f in p.formats if f.format == "fp8")
    batch = min(128, fp8.max_sequences[8192])
    expected = (p.weights.per_gpu_gib * GIB + batch * 8192 * fp8.bytes_per_token_per_gpu) / 3350e9 * 1e3
    assert fp8.decode_step_ms[8192] == pytest.approx(expected)


def test_advice_is_labelled_heuristic_without_probe(tmp_path) -> None:  # noqa: ANN001
    p = plan(load_recipe("llama70b_fp8kv"), probe_dir=tmp_path)
    assert p.advice_basis.startswith("heuristic")
    assert any("FP8" in a for a in p.advice)


def test_layers_kept_in_16_bit_are_planned_per_layer_and_deploy_only_with_vllm() -> None:
    from trtkv.backends import vllm_command
    from trtkv.core.errors import RecipeError
    from trtkv.plan.model import Architecture, seq_bytes
    from trtkv.plan.planner import plan
    from trtkv.recipe.attention import layer_formats

    recipe = load_recipe("smollm2_fp8kv_vllm", ["quantization.kv_skip_layers=[29,0]"])
    assert recipe.quantization.kv_skip_layers == [0, 29] and recipe.kv_format_label == "fp8+bf16[0,29]"
    p = plan(recipe)
    row = next(f for f in p.formats if f.format == "fp8+bf16[0,29]")
    assert p.recipe_kv_format == "fp8+bf16[0,29]" and row.bytes_per_token == 28 * 384 + 2 * 768 == 12288
    args = vllm_command.server_args(recipe, Path("/m"), "127.0.0.1")
    assert args[args.index("--kv-cache-dtype-skip-layers"):][:3] == ["--kv-cache-dtype-skip-layers", "0", "29"]
    arch = Architecture(num_layers=4, num_attention_heads=4, num_kv_heads=2, head_dim=64, hidden_size=256)
    # PP2: stage 0 holds layers 0-1 (layer 0 in bf16), stage 1 layers 2-3: the fuller stage counts
    fmts = layer_formats(arch.layer_list(), KVFormat.FP8, (0,), KVFormat.BF16)
    assert seq_bytes(arch, fmts, 1, 1, 2, with_state=False) == 2 * 2 * 64 * (1 * 1 + 1 * 2)
    for name, extra, message in [
        ("smollm2_fp8kv_vllm", ["quantization.kv_skip_layers=[0,30]"], r"layers \[30\] do not exist"),
        ("smollm2_fp8kv_vllm", ["quantization.kv_skip_layers=[1,1]"], "layers listed twice"),
        ("smollm2_fp8kv_vllm", ["quantization.kv_cache=none", "quantization.kv_skip_layers=[0]"],
         "need a quantized KV cache"),
        ("smollm2_fp8kv", ["quantization.kv_skip_layers=[0]"], "deploys with build.backend vllm"),
        ("llama70b_fp8kv_llmapi", ["quantization.kv_skip_layers=[0]"], "TensorRT-LLM's LLM API stores every layer"),
    ]:
        with pytest.raises(RecipeError, match=message):
            load_recipe(name, extra)


# ---------------------------------------------------------------------------------------------
# Per-layer attention: sliding windows, chunked local, MLA (configs in tests/data/configs, recipes from `trtkv init`)

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
FAMILIES = ["llama3_1_8b", "qwen2_5_7b", "qwen3_8b", "qwen3_30b_a3b", "mistral_7b_v0_1", "gemma2_9b", "gemma3_27b",
            "gpt_oss_120b", "llama4_scout", "deepseek_v2", "deepseek_v3", "kimi_k2"]


def init_recipe(tmp_path: Path, family: str, *extra: str):  # noqa: ANN201 - a Recipe
    from trtkv.cli.init import write_recipe

    path = tmp_path / f"t_{family}.yaml"
    if not path.exists():
        write_recipe(f"t_{family}", CONFIGS / family, path, "H100-80GB")
    return load_recipe(path, list(extra))


def exact_sum(family: str, n: int, bytes_per_element: float = 2.0, tp: int = 1) -> float:
    """One sequence's KV at n tokens, summed here over the config's own layer list."""
    from trtkv.checkpoints import read_model_facts

    f = read_model_facts(CONFIGS / family)
    total = 0.0
    for layer in f.layers:
        if layer.kind.value == "mla":
            total += n * (f.kv_lora_rank + f.qk_rope_head_dim) * bytes_per_element
        else:
            held = min(n, layer.window) if layer.window else n
            total += held * 2 * math.ceil(f.num_kv_heads / tp) * f.head_dim * bytes_per_element
    return total


def vllm_sum(family: str, n: int, batched: int = 8192, block: int = 16) -> float:
    """vLLM's allocation, from kv_cache_interface.py's formulas and its grouping rule, over the layer list."""
    from trtkv.checkpoints import read_model_facts

    f = read_model_facts(CONFIGS / family)
    hybrid = not any(x.kind.value == "chunked" for x in f.layers)
    per: dict[tuple[str, int | None], int] = {}
    for x in f.layers:
        key = (x.kind.value, x.window) if hybrid or x.kind.value == "mla" else ("full", None)
        per[key] = per.get(key, 0) + 1
    if len(per) > 1:
        group = min(per.values()) if max(per.values()) >= 1.5 * min(per.values()) else max(per.values())
        per = {k: -(-v // group) * group for k, v in per.items()}
    total = 0.0
    for (kind, window), count in per.items():
        if kind == "sliding":
            tokens = (-(-min(window - 1 + batched, n) // block) + 1) * block
        elif kind == "chunked":
            tokens = -(-min(window + batched, n) // block) * block
        else:
            tokens = -(-n // block) * block
        elem = (f.kv_lora_rank + f.qk_rope_head_dim) if kind == "mla" else 2 * f.num_kv_heads * f.head_dim
        total += count * tokens * elem * 2
    return total


@pytest.mark.parametrize("family", FAMILIES)
def test_per_sequence_kv_is_the_per_layer_sum(tmp_path: Path, family: str) -> None:
    p = plan(init_recipe(tmp_path, family))
    fp16 = next(f for f in p.formats if f.format == "fp16")
    for n in p.lengths:
        assert fp16.per_sequence_kv_bytes_by_accounting["exact"][n] == pytest.approx(exact_sum(family, n))
        assert fp16.per_sequence_kv_bytes_by_accounting["vllm"][n] == pytest.approx(vllm_sum(family, n))
    assert fp16.per_sequence_kv_bytes == fp16.per_sequence_kv_bytes_by_accounting["exact"]  # backend llmapi
    fp8 = next(f for f in p.formats if f.format == "fp8")
    assert fp8.per_sequence_kv_bytes[32768] == pytest.approx(exact_sum(family, 32768, 1.0))
    assert len(p.attention.layers) == p.model.num_layers


def test_issue_table_figures(tmp_path: Path) -> None:
    """16-bit KV of one 32K sequence (issue #25's table): exact per-layer windows, and vLLM's allocation."""
    got = {}
    for family in ("gemma3_27b", "gpt_oss_120b", "llama4_scout", "deepseek_v3"):
        fp16 = next(f for f in plan(init_recipe(tmp_path, family)).formats if f.format == "fp16")
        got[family] = {a: v[32768] / GIB for a, v in fp16.per_sequence_kv_bytes_by_accounting.items()}
    assert got["gemma3_27b"]["exact"] == pytest.approx(2.9, abs=0.01)
    assert got["gemma3_27b"]["vllm"] == pytest.approx(6.7, abs=0.05)
    assert got["gpt_oss_120b"]["exact"] == pytest.approx(1.13, abs=0.005)
    assert got["llama4_scout"]["exact"] == pytest.approx(2.6, abs=0.03)
    assert got["llama4_scout"]["vllm"] == pytest.approx(6.0, abs=0.01)  # hybrid manager off for chunked local
    assert got["deepseek_v3"]["exact"] == pytest.approx(2.14, abs=0.01)


def test_mla_latent_is_whole_on_every_tp_rank(tmp_path: Path) -> None:
    for family, split in (("deepseek_v3", False), ("llama3_1_8b", True)):
        recipe = init_recipe(tmp_path, family, "build.tp_size=8", "build.pp_size=1", "hardware.count=8")
        fp16 = next(f for f in plan(recipe).formats if f.format == "fp16")
        assert fp16.per_sequence_kv_bytes_per_gpu[32768] == pytest.approx(exact_sum(family, 32768, 2.0, 8 if split
                                                                                    else 1))
    notes = plan(init_recipe(tmp_path, "deepseek_v3")).notes
    assert any("whole on every rank" in n for n in notes)


def test_sliding_layers_kept_16_bit_are_priced_per_layer(tmp_path: Path) -> None:
    from trtkv.checkpoints import read_model_facts
    from trtkv.core.errors import RecipeError

    recipe = init_recipe(tmp_path, "gemma3_27b", "build.backend=vllm", "quantization.kv_skip_layers=[sliding_window]",
                         "quantization.weights=fp8")  # vLLM refuses ModelOpt's FP8-KV export over bf16 weights
    assert recipe.kv_format_label == "fp8+bf16[sliding_window]"
    row = next(f for f in plan(recipe).formats if f.format == recipe.kv_format_label)
    f = read_model_facts(CONFIGS / "gemma3_27b")
    per_token = 2 * f.num_kv_heads * f.head_dim
    expected = sum(min(32768, x.window) * per_token * 2 if x.window else 32768 * per_token * 1 for x in f.layers)
    assert row.per_sequence_kv_bytes_by_accounting["exact"][32768] == pytest.approx(expected)
    with pytest.raises(RecipeError, match="no sliding layer"):
        init_recipe(tmp_path, "llama3_1_8b", "build.backend=vllm", "quantization.kv_skip_layers=[sliding_window]",
                    "quantization.weights=fp8")


def test_plan_json_per_sequence_bytes_and_layer_types(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trtkv.cli import main

    init_recipe(tmp_path, "gpt_oss_120b")
    assert main(["plan", str(tmp_path / "t_gpt_oss_120b.yaml"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    fp16 = next(f for f in data["formats"] if f["format"] == "fp16")
    assert fp16["per_sequence_kv_bytes"]["32768"] == exact_sum("gpt_oss_120b", 32768)
    assert "bytes_per_token" in fp16 and "max_sequences" in fp16  # today's fields stay
    assert data["attention"]["layers"][:2] == ["sliding:128", "full"]
    assert any("no KV cost" in n for n in data["notes"])


def test_hub_id_recipe_plans_from_its_fields_alone(tmp_path: Path) -> None:
    for family in ("gemma3_27b", "deepseek_v3", "llama4_scout"):
        local = plan(init_recipe(tmp_path, family))
        hub = plan(init_recipe(tmp_path, family, "model.source=org/not-on-this-machine"))
        assert hub.model.source == "recipe"
        for a, b in zip(local.formats, hub.formats, strict=True):
            assert a.per_sequence_kv_bytes == b.per_sequence_kv_bytes
        assert hub.weights.total_gib == pytest.approx(local.weights.total_gib, rel=1e-3)


def test_recipe_attention_must_agree_with_the_config(tmp_path: Path) -> None:
    from trtkv.core.errors import RecipeError

    with pytest.raises(RecipeError, match="model.attention_layers: recipe says"):
        plan(init_recipe(tmp_path, "gemma3_27b", "model.attention_layers=[full*62]"))
    with pytest.raises(RecipeError, match="62 layers listed"):
        init_recipe(tmp_path, "gemma3_27b", "model.source=org/x", "model.num_layers=60")


def test_prequantized_weights_priced_as_stored(tmp_path: Path) -> None:
    from trtkv.checkpoints import count_parameters, read_model_facts

    f = read_model_facts(CONFIGS / "gpt_oss_120b")
    c = count_parameters(f)
    p = plan(init_recipe(tmp_path, "gpt_oss_120b"))
    assert p.weights.total_gib * GIB == pytest.approx(c.experts * (0.5 + 1 / 32) + (c.total - c.experts) * 2)
    assert p.weights.precision == "as stored"
