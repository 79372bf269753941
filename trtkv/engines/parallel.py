"""Expert and attention-data parallelism in the engines' memory: what the recipe's EP and attention
DP (trtkv.recipe.parallel.Parallelism) change on each GPU, with the assumptions said where made.

- Weights: the routed experts spread over all tp x pp GPUs whatever ep_size is (EP x expert TP =
  TP in SGLang and TensorRT-LLM; vLLM spreads them over its TP x DP), each held once; the rest
  (attention, dense and shared-expert MLPs, embeddings) over the attention TP x pp, so each
  attention-DP group holds a copy. TensorRT-LLM runs dense MLPs data parallel too under attention
  DP (mlp_tp_size 1) and SGLang keeps them tensor parallel over the whole TP group
  (--moe-dense-tp-size): for SGLang the figure is an upper bound.
- KV: each attention-DP group keeps its own sequences' KV with its KV heads split over the
  attention TP (an MLA latent whole on every rank), so a token costs the attention TP's share per
  GPU and a replica holds attention_dp groups' sequences (SGLang's pool_configurator divides
  max_running_requests by attn_dp_size; vLLM runs one engine core per DP rank).
- Activation: trtkv.engines.activation prices the MoE layer's rows from every attention-DP group
  and EP's all-to-all dispatch / combine buffers under uniform routing.
- Not priced: expert load balancing (vLLM --enable-eplb, SGLang --enable-eplb, TensorRT-LLM's MoE
  load balancer) and redundant experts; trtkv turns none on, and the weights assume every expert
  held once. Routing skew (one rank receiving more than its share) is not modelled.
"""

from __future__ import annotations

from trtkv.core.errors import RecipeError
from trtkv.recipe import Parallelism, Recipe
from trtkv.recipe.backend_rules import BACKEND_ROWS

PARALLEL_NOTE = (
    "not priced: expert load balancing (EPLB) and redundant experts (trtkv turns none on; every "
    "expert held once) and routing skew (all-to-all buffers at the uniform share)"
)


def weights_per_gpu(total_bytes: float, expert_bytes: float, p: Parallelism) -> float:
    """One GPU's weights: the experts over tp x pp GPUs, the rest over attention TP x pp (a copy
    per attention-DP group); plain TP x PP: total / GPUs."""
    if p.attention_dp == 1:
        return total_bytes / p.gpus
    expert = min(max(expert_bytes, 0.0), total_bytes)
    return expert / p.gpus + (total_bytes - expert) / (p.attention_tp * p.pp)


def kv_tp(p: Parallelism) -> int:
    """The TP the KV heads split over: the attention TP of one attention-DP group."""
    return p.attention_tp


def sequence_groups(p: Parallelism) -> int:
    """How many groups of GPUs each hold their own sequences in one replica."""
    return p.attention_dp


def moe_problems(recipe: Recipe, is_moe: bool, where: str) -> list[str]:
    """EP needs routed experts; vLLM's data parallelism on a dense model is replicas. `where`: the
    config the MoE fact was read from."""
    p, out = recipe.parallelism, []
    if p.ep > 1 and not is_moe:
        out.append(
            f"{recipe.path}: build.ep_size {p.ep}: {where} has no routed experts (not an MoE "
            "model), and expert parallelism only spreads experts. Next: set build.ep_size=1."
        )
    if p.attention_dp > 1 and not is_moe and BACKEND_ROWS[recipe.build.backend].dense_dp_replicas:
        out.append(
            f"{recipe.path}: build.attention_dp_size {p.attention_dp}: on a dense model ({where}) "
            "vLLM's --data-parallel-size runs independent replicas (its MLPs are not shared across "
            "DP ranks). Next: set build.attention_dp_size=1 and deploy more replicas "
            "(`trtkv deploy --target-concurrency`), or use backend sglang (--attn-dp-size)."
        )
    return out


def check_moe(recipe: Recipe, is_moe: bool, where: str) -> None:
    """Raise what moe_problems finds (the planner calls it once the model's config is read)."""
    problems = moe_problems(recipe, is_moe, where)
    if problems:
        raise RecipeError(problems, header="Parallelism the model cannot take")
