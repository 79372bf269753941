"""The concurrency cap of one replica, sized for the recipe's workload: the engines admit requests
while their KV blocks last (vLLM's scheduler allocates blocks per step, SGLang its token slots,
TensorRT-LLM's capacity scheduler its blocks), so a cap of the sequences of max_seq_len that fit
leaves most of the pool idle under shorter traffic. The cap the workload asks for is the sequences
of bench.input_tokens + bench.output_tokens that fit in the pool as the recipe's engine accounts
them, held under the engine's own default (its `BatchLimit`, trtkv.engines); the activation a larger
cap costs (sampler rows, CUDA graphs, the TensorRT-LLM warm-up's logits) is the engine rule's, so
`trtkv init` re-plans with the cap it chose until the workload still fits beside it."""

from __future__ import annotations

from trtkv.engines import kv_tp, sequence_groups
from trtkv.plan.engine_pool import memory_rule
from trtkv.plan.model import Architecture, recipe_accounting, seq_bytes
from trtkv.plan.result import PlanConcurrency
from trtkv.recipe import Recipe
from trtkv.recipe.attention import layer_formats

# the cap's name where the engine has no limit of its own (trtkv's reference runtime)
RECIPE_FIELD = "build.max_batch_size"


def workload_bytes(recipe: Recipe, arch: Architecture) -> float:
    """One sequence of the workload (bench input + output tokens) on the fullest GPU of the group
    that holds it (KV heads split over an attention-DP group's TP), in the recipe's KV format as its
    engine accounts it (blocks, sliding windows, a hybrid's state)."""
    b = recipe.build
    accounting, block = recipe_accounting(recipe)
    fmts = layer_formats(
        arch.layer_list(),
        recipe.kv_format,
        tuple(recipe.quantization.kv_skip_layers),
        recipe.kv_skip_format,
    )
    tokens = recipe.bench.input_tokens + recipe.bench.output_tokens
    tp = kv_tp(recipe.parallelism)
    return seq_bytes(arch, fmts, tokens, tp, b.pp_size, accounting, b.max_num_tokens, block)


def concurrency(
    recipe: Recipe, arch: Architecture, pool_bytes: float, full_context: int, pool_tokens: int
) -> PlanConcurrency:
    """Full-context sequences that fit, the workload's, the engine's own limit, the cap passed and
    the cap the workload asks for."""
    per_sequence = workload_bytes(recipe, arch)
    # every attention-DP group keeps its own sequences (as plan's max_sequences counts them)
    groups = sequence_groups(recipe.parallelism)
    fits = groups * int(pool_bytes // per_sequence) if pool_bytes > 0 and per_sequence > 0 else 0
    limiter = memory_rule(recipe).batch_limit
    limit = limiter(recipe, pool_tokens) if limiter is not None else None
    sized = max(1, min(fits, limit.sequences) if limit is not None else fits)
    return PlanConcurrency(
        max_seq_len=recipe.build.max_seq_len,
        full_context_sequences=full_context,
        input_tokens=recipe.bench.input_tokens,
        output_tokens=recipe.bench.output_tokens,
        workload_sequences=fits,
        engine_limit=limit.sequences if limit is not None else None,
        engine_limit_source=limit.source if limit is not None else "no limit of its own",
        flag=limit.flag if limit is not None else RECIPE_FIELD,
        cap=recipe.build.max_batch_size,
        sized=sized,
    )
