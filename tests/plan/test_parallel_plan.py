"""`plan` prices expert and attention-data parallelism (trtkv.engines.parallel): the experts spread over every GPU
and the rest held by each attention-DP group, the KV heads split over one group's TP with each group keeping its
own sequences, the MoE layer's rows and EP's all-to-all buffers; EP on a dense model is refused."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from trtkv.core.errors import RecipeError
from trtkv.engines.activation import ModelShape, Setup, all_to_all_bytes, forward_peak_bytes
from trtkv.plan.model import resolve_architecture
from trtkv.plan.planner import plan
from trtkv.recipe import load_recipe
from trtkv.units import GIB

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
PLAIN = ("build.ep_size=1", "build.attention_dp_size=1")  # init proposes both for an MoE model


def init_recipe(tmp_path: Path, family: str, count: int, backend: str, *overrides: str):  # noqa: ANN201
    from trtkv.cli.init import write_recipe

    path = tmp_path / f"p_{family}_{backend}_{count}.yaml"
    if not path.exists():
        write_recipe(f"p_{family}_{backend}_{count}", CONFIGS / family, path, "H200-141GB", count=count,
                     backend=backend)
    return load_recipe(path, list(overrides))


def capacity(p, n: int) -> int:  # noqa: ANN001 - a Plan
    return next(c for c in p.formats if c.format == p.recipe_kv_format).max_sequences[n]


def test_attention_dp_keeps_mla_latents_once_per_group_and_replicates_the_rest(tmp_path: Path) -> None:
    """DeepSeek-V3 on 8 x H200 (LLM API): under TP8 every rank holds each sequence's whole MLA latent; with attention
    DP each of 8 ranks holds only its own sequences, so the replica fits about 8x the sequences, less what the
    replicated attention weights take."""
    plain = init_recipe(tmp_path, "deepseek_v3", 8, "llmapi", *PLAIN)
    dp = init_recipe(tmp_path, "deepseek_v3", 8, "llmapi", "build.ep_size=8", "build.attention_dp_size=8")
    a, b = plan(plain), plan(dp)
    arch = resolve_architecture(dp)
    share = arch.expert_parameters / arch.parameters()
    total = b.weights.total_gib
    assert b.weights.per_gpu_gib == pytest.approx(total * share / 8 + total * (1 - share), rel=1e-9)
    assert a.weights.per_gpu_gib == pytest.approx(total / 8, rel=1e-12)
    n = dp.build.max_seq_len
    fmt_a = next(c for c in a.formats if c.format == a.recipe_kv_format)
    fmt_b = next(c for c in b.formats if c.format == b.recipe_kv_format)
    assert fmt_b.bytes_per_token_per_gpu == fmt_a.bytes_per_token_per_gpu  # the latent is whole on a rank either way
    per_group = int(b.kv_pool_bytes_per_gpu // fmt_b.per_sequence_kv_bytes_per_gpu[n])
    assert capacity(b, n) == 8 * per_group and capacity(b, n) > 4 * capacity(a, n)
    assert any("TP8 PP1 EP8 attention-DP8" in note and "not priced" in note for note in b.notes)


def test_attention_dp_splits_kv_heads_over_the_group_tp_only(tmp_path: Path) -> None:
    """Qwen3-30B-A3B (4 KV heads) on 4 GPUs with SGLang: TP4 gives each GPU one KV head per token; attention DP 4
    leaves a group TP of 1, so each GPU holds all 4 heads of its own sequences."""
    plain = plan(init_recipe(tmp_path, "qwen3_30b_a3b", 4, "sglang", *PLAIN))
    dp = plan(init_recipe(tmp_path, "qwen3_30b_a3b", 4, "sglang", "build.attention_dp_size=4", "build.ep_size=4"))
    a, b = (next(c for c in p.formats if c.format == p.recipe_kv_format) for p in (plain, dp))
    assert b.bytes_per_token_per_gpu == 4 * a.bytes_per_token_per_gpu
    assert b.tokens_per_gpu_budget == int(dp.kv_pool_bytes_per_gpu // b.bytes_per_token_per_gpu)


def test_ep_needs_routed_experts_and_vllm_dp_on_a_dense_model_is_replicas(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="has no routed experts"):
        plan(init_recipe(tmp_path, "qwen3_32b", 2, "sglang", "build.ep_size=2"))
    with pytest.raises(RecipeError, match="runs independent replicas"):
        plan(init_recipe(tmp_path, "qwen3_32b", 2, "vllm", "build.attention_dp_size=2"))
    assert plan(init_recipe(tmp_path, "qwen3_32b", 2, "sglang", "build.attention_dp_size=2")).formats


def test_the_moe_layer_prices_every_groups_rows_and_eps_all_to_all() -> None:
    shape = ModelShape(layers=48, hidden=2048, intermediate=0, vocab=151936, experts_per_token=8,
                       expert_intermediate=768)
    plain = Setup(gpu_total_bytes=141e9, tp=8, pp=1, weights_bytes=0, kv_bytes_per_token=0, max_num_tokens=8192,
                  max_num_seqs=64)
    t, h, k = 8192, 2048, 8
    # plain TP: every token's top-k expert widths split over TP, three hidden-size tensors beside them
    assert forward_peak_bytes(shape, plain) == t * 2 * (k * (3 * math.ceil(768 / 8) + h) + 3 * h)
    assert all_to_all_bytes(shape, plain) == 0
    ep = Setup(**{**plain.__dict__, "ep": 8, "attention_dp": 8})
    rows, pairs = t * 8, t * 8 * k / 8  # every group's tokens reach the experts, their pairs over 8 EP ranks
    a2a = 2 * (t * k + pairs) * h * 2
    assert all_to_all_bytes(shape, ep) == a2a
    assert forward_peak_bytes(shape, ep) == 2 * (pairs * (3 * 768 + h) + rows * 3 * h) + a2a
    assert a2a / GIB == pytest.approx(2 * (65536 + 65536) * 2048 * 2 / GIB)


def test_init_proposes_wide_ep_for_an_moe_model_where_it_fits_more(tmp_path: Path) -> None:
    """DeepSeek-V3 on 8 x H200: init writes EP 8 and attention DP 8 (each GPU its own MLA latents) with the
    sequences that fit either way in the comment; a dense model and the CPU get neither."""
    recipe = init_recipe(tmp_path, "deepseek_v3", 8, "llmapi")
    assert (recipe.build.ep_size, recipe.build.attention_dp_size) == (8, 8)
    text = (tmp_path / "p_deepseek_v3_llmapi_8.yaml").read_text()
    line = next(x for x in text.splitlines() if x.strip().startswith("attention_dp_size:"))
    wide, plain = map(int, re.findall(r"(\d+) of max_seq_len fit, (\d+) under plain TP", line)[0])
    # the cap follows the bench workload (2K-token sequences, more than those of max_seq_len), within the engine's
    # own limit (#52's concurrency cap)
    assert wide > plain and wide <= recipe.build.max_batch_size <= 2048
    dense = init_recipe(tmp_path, "qwen3_32b", 2, "sglang")
    assert not dense.parallelism.active


def test_the_step_model_takes_the_recipes_ep_and_attention_dp(tmp_path: Path) -> None:
    """plan --estimate's own model (trtkv.plan.moe_step, #49) reads Recipe.parallelism: attention at one group's TP,
    the experts over every GPU with the all-to-all of EP under attention DP, each group its share of the
    concurrency."""
    from trtkv.plan.estimate import estimate, model_shape

    wide = init_recipe(tmp_path, "deepseek_v3", 8, "llmapi")
    plain = init_recipe(tmp_path, "deepseek_v3", 8, "llmapi", *PLAIN)
    arch = resolve_architecture(wide)
    m, p = model_shape(arch, wide), model_shape(arch, plain)
    assert (m.tp, m.moe.ep, m.moe.attention_dp) == (1, 8, 8) and (p.tp, p.moe.ep, p.moe.attention_dp) == (8, 1, 1)
    rows = {r.concurrency: r for r in estimate(wide, plan(wide), use_aiconfigurator=False).rows
            if r.format == wide.kv_format_label}
    one = {r.concurrency: r for r in estimate(plain, plan(plain), use_aiconfigurator=False).rows
           if r.format == plain.kv_format_label}
    assert rows and set(rows) == set(one)
    # 8 sequences over 8 attention-DP ranks: each rank decodes one, with the experts' all-to-all on top
    assert rows[8].itl_ms != one[8].itl_ms


def test_aiconfigurator_is_asked_at_the_recipes_ep_and_attention_dp(tmp_path: Path) -> None:
    """aiconfigurator's request (trtkv.plan.aic, #49 item 2) carries the recipe's layout in its terms: tp one
    attention-DP group's, tp x attention_dp = moe_tp x ep."""
    from trtkv.plan import aic

    wide = init_recipe(tmp_path, "deepseek_v3", 8, "llmapi")
    plain = init_recipe(tmp_path, "deepseek_v3", 8, "llmapi", *PLAIN)
    arch = resolve_architecture(wide)
    got = aic.request(wide, arch, ["fp8"], [8], "/m")
    assert (got["tp"], got["attention_dp"], got["moe_tp"], got["moe_ep"]) == (1, 8, 1, 8)
    got = aic.request(plain, arch, ["fp8"], [8], "/m")
    assert (got["tp"], got["attention_dp"], got["moe_tp"], got["moe_ep"]) == (8, 1, 8, 1)
