"""KV capacity per tier, per format: the device pool the plan sized and the recipe's host tier
(`triton.kv_host_tier_gib_per_replica`, as its engine pins it: the backend's MemoryRule.host_tier,
trtkv.engines.kv_tiers), in tokens and in sequences of the workload (bench.input_tokens +
bench.output_tokens).

Assumptions, said where they are made:
- a token costs the same bytes in host memory as in the device pool, in every format (each engine
  copies device blocks as they are: trtkv.engines.kv_tiers' docstring cites where); so the host
  tier's tokens per format are its bytes per GPU / the format's bytes per token per GPU, like the
  device pool's.
- a running sequence's KV lives on the device: the host tier adds no running sequences; it keeps
  the KV of sequences that wait (multi-turn sessions between turns, shared prefixes) for reuse
  instead of recomputing it. `resident_sequences` counts the workload's sequences whose KV the two
  tiers hold together, `running_sequences` those the device pool runs at once.
- the hit rate this buys and its TTFT are `plan --estimate`'s, on a prefix-sharing workload
  (bench.prefix: trtkv.plan.prefix_reuse).
"""

from __future__ import annotations

from trtkv.plan.engine_pool import memory_rule
from trtkv.plan.result import FormatCapacity, PlanKVTiers, TierRow
from trtkv.recipe import Recipe


def tier_capacity(recipe: Recipe, caps: list[FormatCapacity]) -> PlanKVTiers | None:
    """The plan's tiers section (None: the recipe sets no host tier)."""
    rule = memory_rule(recipe).host_tier
    tier = rule(recipe) if rule is not None else None
    if tier is None:
        return None
    per_seq = recipe.bench.input_tokens + recipe.bench.output_tokens
    per_gpu = tier.bytes_per_replica / recipe.parallelism.gpus
    rows = []
    for c in caps:
        host = int(per_gpu // c.bytes_per_token_per_gpu) if c.bytes_per_token_per_gpu else 0
        rows.append(
            TierRow(
                format=c.format,
                device_tokens=c.tokens_per_gpu_budget,
                host_tokens=host,
                running_sequences=c.tokens_per_gpu_budget // per_seq,
                resident_sequences=(c.tokens_per_gpu_budget + host) // per_seq,
            )
        )
    return PlanKVTiers(
        engine=tier.engine,
        host_bytes_per_replica=tier.bytes_per_replica,
        served=tier.served,
        scope=tier.scope,
        numa=tier.numa,
        input_tokens=recipe.bench.input_tokens,
        output_tokens=recipe.bench.output_tokens,
        rows=rows,
    )


def tier_lines(section: PlanKVTiers) -> list[str]:
    """The plan's text: one line per format."""
    out = [
        f"KV tiers per replica ({section.engine}: {section.served}; {section.scope}), the "
        f"workload {section.input_tokens} in + {section.output_tokens} out:"
    ]
    for r in section.rows:
        out.append(
            f"  {r.format:<16} device {r.device_tokens:>12,} tokens ({r.running_sequences:,} "
            f"running) + host {r.host_tokens:>12,} tokens = {r.resident_sequences:,} sequences "
            "resident"
        )
    return out
