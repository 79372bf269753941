"""The plan as the later stages read it (trtkv.contracts.plan_figures.PlanFigures): `trtkv serve`,
`status`, `bench`, `deploy` and `report` get it from the CLI instead of importing the planner."""

from __future__ import annotations

from trtkv.contracts.plan_figures import PlanFigures, PlannedFormat
from trtkv.plan.model import kv_format_for_recipe
from trtkv.plan.planner import plan
from trtkv.plan.prefix_predicted import predicted
from trtkv.recipe import Recipe


def figures(recipe: Recipe) -> PlanFigures:
    """The recipe's plan, typed for the stages that read it."""
    p = plan(recipe)
    seq_len = recipe.build.max_seq_len
    return PlanFigures(
        recipe=recipe.name,
        engine=p.kv_pool.engine,
        engine_version=p.kv_pool.version,
        kv_pool_bytes_per_gpu=p.kv_pool_bytes_per_gpu,
        gpu=p.hardware.gpu.value,
        memory_gib=p.hardware.memory_gib,
        recipe_kv_format=p.recipe_kv_format,
        kv_format=kv_format_for_recipe(recipe).value,
        formats={
            c.format: PlannedFormat(
                bytes_per_token=c.bytes_per_token,
                bytes_per_token_per_gpu=c.bytes_per_token_per_gpu,
                tokens_per_gpu=c.tokens_per_gpu_budget,
                sequences_at_max_seq_len=c.max_sequences.get(seq_len),
                decode_step_ms=float(c.decode_step_ms.get(seq_len, 0.0)),
            )
            for c in p.formats
        },
        max_seq_len=seq_len,
        weights_gib_total=p.weights.total_gib,
        weights_gib_per_gpu=p.weights.per_gpu_gib,
        batch_flag=p.concurrency.flag,
        bench_input_tokens=p.concurrency.input_tokens,
        bench_output_tokens=p.concurrency.output_tokens,
        bench_sequences=p.concurrency.workload_sequences,
        prefix=predicted(recipe, p),
    )
