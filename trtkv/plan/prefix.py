"""What a prefix-cache hit rate does to KV capacity, per format: with prefix caching (KV block
reuse) a shared prompt prefix is held once, so a sequence of the recipe's workload
(bench.input_tokens in, bench.output_tokens out) holds only (1 - hit rate) x input + output tokens
of KV of its own. The sequences a replica holds at hit rate h are then the format's tokens per GPU
budget / that; the quantized format's ratio to fp16 stays its bytes ratio, but the sequences it adds
grow as 1 / (1 - h x input / (input + output)), and its larger pool keeps more distinct prefixes
resident (fewer evictions: a higher hit rate to begin with). Where the engine does not reuse blocks
(trtkv.recipe.prefix_cache: e.g. TensorRT-LLM INT8 KV without paged context FMHA) every hit rate
counts as 0.
"""

from __future__ import annotations

from trtkv.plan.result import FormatCapacity, PlanPrefixCache, PrefixRow
from trtkv.recipe import Recipe
from trtkv.recipe.prefix_cache import prefix_cache

HIT_RATES = (0.0, 0.5, 0.9)


def held_tokens(recipe: Recipe, hit_rate: float) -> float:
    """KV tokens one sequence of the workload holds of its own at `hit_rate` (the shared prefix
    counted once)."""
    return (1 - hit_rate) * recipe.bench.input_tokens + recipe.bench.output_tokens


def prefix_capacity(recipe: Recipe, caps: list[FormatCapacity]) -> PlanPrefixCache:
    """The plan's prefix-cache section: whether the engine reuses blocks (and why), and sequences
    per replica of the workload at each hit rate, per format."""
    pc = prefix_cache(recipe)
    rates = HIT_RATES if pc.enabled else (0.0,)
    rows = [
        PrefixRow(
            format=c.format,
            sequences={
                f"{h:g}": int(c.tokens_per_gpu_budget // held_tokens(recipe, h)) for h in rates
            },
        )
        for c in caps
    ]
    return PlanPrefixCache(
        enabled=pc.enabled,
        why=pc.why,
        input_tokens=recipe.bench.input_tokens,
        output_tokens=recipe.bench.output_tokens,
        hit_rates=list(rates),
        rows=rows,
    )


def advice(recipe: Recipe, section: PlanPrefixCache) -> list[str]:
    """One line: what the hit rate does here, for the recipe's format against fp16."""
    if not section.enabled:
        return [
            f"Prefix caching is off here ({section.why.removeprefix('off: ')}): a shared prompt "
            "prefix is held once per sequence, so hit rates buy no capacity on this build."
        ]
    by = {r.format: r.sequences for r in section.rows}
    mine, base = by.get(recipe.kv_format_label) or next(iter(by.values())), by.get("fp16")
    if base is None:
        return []
    top = f"{section.hit_rates[-1]:g}"
    return [
        f"Prefix caching on ({section.why}): at a {float(top):.0%} prefix hit rate the workload's "
        f"{section.input_tokens}-in/{section.output_tokens}-out sequences per replica go from "
        f"{mine['0']:,} to {mine[top]:,} ({recipe.kv_format_label}) vs {base['0']:,} to "
        f"{base[top]:,} (fp16): the higher the hit rate, the more sequences a quantized cache "
        "adds, and its larger pool keeps more prefixes resident."
    ]
