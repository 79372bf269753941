"""The hit rates per tier `trtkv plan` predicts for bench.prefix's workload on the recipe's own KV
format, per concurrency level: what `trtkv bench` records beside the rates the server reports
(trtkv.contracts.PrefixPrediction, handed over in PlanFigures.prefix; bench does not import the
planner). The model is `plan --estimate`'s (trtkv.plan.prefix_reuse.turn_hits) on the plan's own
pools, so it also runs where the estimate's speed model does not (the CPU runtimes):
- the device pool: Plan.kv_pool_bytes_per_gpu over the format's bytes per token per GPU (the
  reference runtime: its device tier, max_batch_size x max_seq_len tokens of its format);
- the host tier: the engine's (triton.kv_host_tier_gib_per_replica as the engine pins it,
  trtkv.plan.tiers), the reference runtime's second pool (recipe.prefix_cache.host_tier_bytes:
  exclusive, as TensorRT-LLM's secondary pool: trtkv.runtime.block_reuse);
- occupancy: with no think time every session runs a turn at a time (exact: its slot is never
  idle); with a think time the share running comes from trtkv's speed model where it prices the
  engine and GPU, else every session is counted running (said in the basis); at most the
  sessions whose blocks the device pool holds are admitted (prefix_reuse.sessions_fit).
"""

from __future__ import annotations

from trtkv.contracts.prefix import PredictedHits, PrefixPrediction
from trtkv.core.errors import TrtkvError
from trtkv.plan.engine_pool import memory_rule
from trtkv.plan.moe_step import rank_concurrency
from trtkv.plan.prefix import sessions
from trtkv.plan.prefix_reuse import host_tier, occupancy, routing, sessions_fit, turn_hits
from trtkv.plan.result import Plan
from trtkv.platform.hardware import GPU_SPECS
from trtkv.recipe import Recipe
from trtkv.recipe.backend_rules import SPEED_ENGINE
from trtkv.recipe.prefix_cache import host_tier_bytes, prefix_cache

REFERENCE_TIERS = (
    "trtkv's reference runtime: device tier LRU, evicted blocks move to its host tier and are "
    "copied back on a hit (exclusive, as TensorRT-LLM's secondary pool)"
)


def host_bytes_per_engine(recipe: Recipe) -> tuple[float, bool, str]:
    """(host-tier bytes per GPU, whether the host tier is inclusive of the device pool, the
    eviction said in words)."""
    tier = host_tier(recipe)
    # the reference runtime's second pool (no engine host-tier rule; 0 for every other backend)
    own_pool = host_tier_bytes(recipe)
    if tier is None and own_pool:
        return float(own_pool), False, REFERENCE_TIERS
    if tier is None:
        return 0.0, False, "device pool only (no host tier set), LRU"
    return tier.bytes_per_replica / recipe.parallelism.gpus, tier.inclusive, tier.reuse


def running_share(recipe: Recipe, concurrency: int) -> tuple[float, str]:
    """(sessions running a turn on one engine, how that was found)."""
    think = recipe.bench.prefix.think_time_s
    if think <= 0:
        return float(concurrency), "no think time: every session runs a turn"
    gpu, backend = recipe.hardware.gpu, recipe.build.backend
    unpriced = (
        f"think {think:g} s not priced (no speed model for {backend.value} on {gpu.value}): "
        "every session counted running, an upper bound on the history hits"
    )
    if gpu not in GPU_SPECS or backend not in SPEED_ENGINE:
        return float(concurrency), unpriced
    try:
        return service_share(recipe, concurrency)
    except TrtkvError as exc:  # a plan the speed model cannot price still hands its pools over
        return float(concurrency), f"{unpriced.split(' (')[0]} ({exc})"


def service_share(recipe: Recipe, concurrency: int) -> tuple[float, str]:
    """running_share from trtkv's speed model: a turn's service time against the think time."""
    from trtkv.plan.estimate import kv_cost, model_shape
    from trtkv.plan.model import resolve_architecture
    from trtkv.plan.speed import kernels_for

    think = recipe.bench.prefix.think_time_s
    arch = resolve_architecture(recipe)
    kv = kv_cost(arch, recipe, recipe.kv_format, tuple(recipe.quantization.kv_skip_layers))
    k = kernels_for(recipe.hardware.gpu, SPEED_ENGINE[recipe.build.backend])
    _, service_ms, running = occupancy(recipe, k, model_shape(arch, recipe), kv, concurrency)
    return running, f"turn {service_ms:,.0f} ms ({k.source}) against think {think:g} s"


def predicted(recipe: Recipe, p: Plan) -> PrefixPrediction | None:
    """The plan's hit rates per tier for bench.prefix on the recipe's own format, per level (None:
    no prefix workload, or the engine keeps no prefix cache)."""
    if not recipe.bench.prefix.enabled or not prefix_cache(recipe).enabled:
        return None
    own = next((c for c in p.formats if c.format == p.recipe_kv_format), None)
    if own is None or own.bytes_per_token_per_gpu <= 0:
        return None
    per_token = own.bytes_per_token_per_gpu
    device = p.kv_pool_bytes_per_gpu / per_token
    host_bytes, inclusive, eviction = host_bytes_per_engine(recipe)
    host = host_bytes / per_token
    block = max(1, memory_rule(recipe).block_tokens(recipe))
    dp = recipe.parallelism.attention_dp
    routed = routing(recipe) + ("; round-robin would cut the history hits" if dp > 1 else "")
    turns = sessions(recipe)
    total = sum(t[0] for t in turns)
    shared = recipe.bench.prefix.shared_tokens
    context = round(total / len(turns)) + recipe.bench.output_tokens / 2
    own_tokens = max(0.0, context - shared)
    fit = sessions_fit(device, own_tokens, shared, recipe.bench.prefix.groups)
    levels = {}
    for conc in recipe.bench.concurrency:
        c = rank_concurrency(conc, dp)
        running, how_running = running_share(recipe, c)
        # admitted: at most the sessions whose blocks the pool holds (prefix_reuse.sessions_fit)
        admitted = min(running, fit)
        hits = turn_hits(recipe, block, device, host, c, admitted, inclusive)
        levels[conc] = PredictedHits(
            device=round(sum(h.device for h in hits) / total, 4),
            host=round(sum(h.host for h in hits) / total, 4),
            routing=routed,
            basis=f"device {int(device):,} tokens, host {int(host):,} tokens per engine; "
            f"blocks of {block}; {eviction}; {how_running}",
        )
    return PrefixPrediction(
        kv_format=p.recipe_kv_format,
        block_tokens=block,
        device_tokens=int(device),
        host_tokens=int(host),
        levels=levels,
    )
