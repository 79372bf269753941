"""What prefix reuse does to KV capacity, per format: with prefix caching (KV block reuse) a shared
prompt prefix is held once, so a sequence of the recipe's workload (its prompt in,
bench.output_tokens out) holds only (1 - hit rate) x prompt + output tokens of KV of its own. The
prompt is bench.input_tokens, or under bench.prefix a session's mean over its turns (a later turn
sends the history: the prompt grows by turn_tokens + output_tokens a turn), the same tokens the
hit rate is a share of. The sequences a replica holds at hit rate h are then the format's tokens
per GPU budget / that.

The hit rates are the workload's, not fixed: 0, and where the recipe sends a prefix-sharing
workload (bench.prefix) its reusable share, the hit rate if every reusable block stayed resident
(the shared system prompt and each later turn's history, in the engine's whole blocks, never a
prompt's last token). How much of that share each format's pools keep, per tier, and the TTFT it
buys is `plan --estimate`'s (trtkv.plan.prefix_reuse). Where the engine does not reuse blocks
(trtkv.recipe.prefix_cache: e.g. TensorRT-LLM INT8 KV without paged context FMHA) the rate is 0.
"""

from __future__ import annotations

from trtkv.plan.engine_pool import memory_rule
from trtkv.plan.result import FormatCapacity, PlanPrefixCache, PrefixRow
from trtkv.recipe import Recipe
from trtkv.recipe.prefix_cache import prefix_cache


def sessions(recipe: Recipe) -> list[tuple[int, int, int]]:
    """Per turn: (prompt tokens, of which the shared prefix, of which reusable history) of one
    session of the workload (the history: the previous prompt and its answer)."""
    b, p = recipe.bench, recipe.bench.prefix
    out = []
    for t in range(1, p.turns + 1):
        prompt = b.input_tokens + (t - 1) * (p.turn_tokens + b.output_tokens)
        history = prompt - p.turn_tokens if t > 1 else p.shared_tokens
        out.append((prompt, p.shared_tokens, history))
    return out


def block_floor(tokens: float, block: int) -> int:
    return int(tokens // block * block)


def reusable_share(recipe: Recipe) -> float:
    """The share of a session's prompt tokens that can hit: each turn's reusable tokens in the
    engine's whole blocks, at most the prompt less its last token, over all prompt tokens."""
    block = max(1, memory_rule(recipe).block_tokens(recipe))
    turns = sessions(recipe)
    hit = sum(block_floor(min(history, prompt - 1), block) for prompt, _, history in turns)
    return hit / sum(prompt for prompt, _, _ in turns)


def mean_prompt(recipe: Recipe) -> float:
    """The workload's prompt tokens per request: bench.input_tokens, or under bench.prefix the mean
    over a session's turns."""
    if not recipe.bench.prefix.enabled:
        return float(recipe.bench.input_tokens)
    turns = sessions(recipe)
    return sum(prompt for prompt, _, _ in turns) / len(turns)


def held_tokens(recipe: Recipe, hit_rate: float) -> float:
    """KV tokens one sequence of the workload holds of its own at `hit_rate` (the shared prefix
    counted once): (1 - hit_rate) x its mean prompt + its answer, which over a session's turns is
    the mean of what each turn holds (the hit rate is a share of all its prompt tokens)."""
    return (1 - hit_rate) * mean_prompt(recipe) + recipe.bench.output_tokens


def prefix_capacity(recipe: Recipe, caps: list[FormatCapacity]) -> PlanPrefixCache:
    """The plan's prefix-cache section: whether the engine reuses blocks (and why), and sequences
    per replica of the workload at no hits and at the workload's reusable share, per format."""
    pc = prefix_cache(recipe)
    share = round(reusable_share(recipe), 4) if recipe.bench.prefix.enabled else 0.0
    rates = (0.0, share) if pc.enabled and share > 0 else (0.0,)
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
        input_tokens=round(mean_prompt(recipe)),
        output_tokens=recipe.bench.output_tokens,
        hit_rates=list(rates),
        rows=rows,
    )


def advice(recipe: Recipe, section: PlanPrefixCache) -> list[str]:
    """One line: what the workload's hit rate does here, for the recipe's format against fp16."""
    if not section.enabled:
        return [
            f"Prefix caching is off here ({section.why.removeprefix('off: ')}): a shared prompt "
            "prefix is held once per sequence, so hit rates buy no capacity on this build."
        ]
    if len(section.hit_rates) == 1:
        return [
            f"Prefix caching on ({section.why}), but the recipe's workload shares no prefix "
            "(bench.prefix unset), so the plan prices no hits: set bench.prefix.* (a shared system "
            "prompt, multi-turn sessions; docs/recipes.md) and `plan --estimate` derives the hit "
            "rate per tier and the TTFT it buys."
        ]
    by = {r.format: r.sequences for r in section.rows}
    mine, base = by.get(recipe.kv_format_label) or next(iter(by.values())), by.get("fp16")
    if base is None:
        return []
    top = f"{section.hit_rates[-1]:g}"
    prompt = (
        f"{section.input_tokens}-in"
        if recipe.bench.prefix.turns == 1
        else f"{section.input_tokens}-in (a session's mean prompt over its turns)"
    )
    return [
        f"Prefix caching on ({section.why}): the workload's reusable share (bench.prefix: shared "
        f"prompt and session history, whole blocks) is {float(top):.0%}; if it all stays resident "
        f"the {prompt}/{section.output_tokens}-out sequences per replica go from "
        f"{mine['0']:,} to {mine[top]:,} ({recipe.kv_format_label}) vs {base['0']:,} to "
        f"{base[top]:,} (fp16); how much each format's pools keep, per tier, and its TTFT: `plan "
        "--estimate`."
    ]
