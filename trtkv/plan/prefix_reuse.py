"""`plan --estimate` on a prefix-sharing workload (`bench.prefix`: a shared system prompt per group,
multi-turn sessions with a think time): the hit rate per KV tier, derived from the pool sizes and
the workload's working set under each engine's eviction, and the TTFT it buys, per KV format and
concurrency level. One source per comparison: both TTFTs of a row (without and with reuse) are
trtkv's model (trtkv.plan.speed), whatever priced the estimate's own rows.

The model, each assumption said where it is made:
- Pools, per engine (one attention-DP group): the device tokens the plan's pool holds of the
  format (Plan.kv_pool_bytes_per_gpu / the format's bytes per token per GPU at the session's
  longest length) and the host tier's tokens (triton.kv_host_tier_gib_per_replica as the engine
  pins it, the same bytes per token: trtkv.plan.tiers).
- Routing: the plan prices one replica carrying bench.concurrency; with attention-DP engines inside
  it, sessions are routed prefix-aware (each session's turns to the engine that holds its
  history, as Dynamo's KV router or SGLang's cache-aware router do); round-robin routing would cut
  the history hits by the number of engines.
- Occupancy: a session runs a turn (TTFT + (output - 1) x ITL of trtkv's model) then thinks
  `think_time_s` holding its concurrency slot (AIPerf's closed loop); running sessions' blocks are
  referenced (not evictable), a shared prefix counted once per group that has a running session;
  the rest of the device pool holds unreferenced blocks under LRU (vLLM's free-block queue,
  SGLang's radix tree, TensorRT-LLM's reuse pool all evict the least recently used unreferenced
  block first).
- Admission: the engine admits a waiting request only when the pool has blocks for it (vLLM's
  scheduler leaves it waiting when kv_cache_manager.allocate_slots returns None, SGLang's
  PrefillAdder at NO_TOKEN, TensorRT-LLM's GUARANTEED_NO_EVICT capacity scheduler), so the
  sessions that run at once are at most those whose referenced blocks fit the device pool; the
  rest wait for one to finish. Saturated, the closed loop's throughput is fitting / service time
  and a session's wait is concurrency x service / fitting - service - think (Little's law), zero
  when everything fits; a hit shortens the service, hence the wait. With no reuse each session
  holds its whole context.
- Reuse distance (LRU's stack distance): a session's history is reused after the think time, in
  which every other session's finished turn frees its context into the LRU; a group's prefix is
  reused by the group's next turn, `groups` turns later. An item survives when the content freed
  in between fits the free pool; with the spread of real turn lengths, trtkv takes the fraction
  free / distance (capped at 1) rather than LRU's step at equal lengths.
- The host tier, per engine: vLLM's OffloadingConnector (native) and SGLang's HiCache
  (write-through) store every computed block in host memory as it is computed: the host tier holds
  a superset (inclusive), resident anywhere = max(device, host); TensorRT-LLM's secondary pool
  takes the blocks the device pool evicts and onboards them on reuse (exclusive): device + host.
- Block granularity: only whole blocks hit (vLLM 16 tokens, SGLang 1, TensorRT-LLM
  tokens_per_block), and never the prompt's last token (every engine computes it for the logits).
- TTFT of a turn: trtkv's model's TTFT for the prompt x (the prefill of the missed tokens,
  attending to the cached ones, / the whole prompt's prefill) plus the host hits' copy over the
  GPU's host link (trtkv.platform.host_link: per GPU, each rank its share). The queue ahead of a
  prefill shrinks with it in proportion (a lower load would shrink it more: conservative).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trtkv.engines import HostTier
from trtkv.plan.engine_pool import memory_rule
from trtkv.plan.estimate_model import PrefixReuse, PrefixReuseRow
from trtkv.plan.moe_step import rank_concurrency
from trtkv.plan.prefix import block_floor, mean_prompt, sessions
from trtkv.plan.speed import Kernels, KVCost, ModelShape, Serving, serve, step_time
from trtkv.platform import HostLink, host_link_of
from trtkv.recipe import Recipe
from trtkv.recipe.prefix_cache import prefix_cache


@dataclass(frozen=True)
class TurnHits:
    """Tokens of one turn's prompt that hit, per tier, block-floored."""

    prompt: int
    device: float
    host: float


def host_tier(recipe: Recipe) -> HostTier | None:
    """The recipe's host KV tier as its engine is told it (None: unset, or the engine has none)."""
    rule = memory_rule(recipe).host_tier
    return rule(recipe) if rule is not None else None


def survives(free: float, distance: float) -> float:
    """The share of items an LRU of `free` tokens keeps over a reuse distance of `distance`
    tokens (see the module docstring)."""
    if distance <= 0:
        return 1.0
    return max(0.0, min(1.0, free / distance))


def sessions_fit(device: float, own: float, shared: float, groups: int) -> float:
    """How many sessions' referenced blocks the device pool holds at once: each its own `own`
    tokens, a group's `shared` prefix once per group with a session running (a real number: the
    mean over time)."""
    whole = own + shared
    if whole <= 0:
        return math.inf
    n = device / whole
    if n <= groups:
        return n
    return math.inf if own <= 0 else (device - groups * shared) / own


def routing(recipe: Recipe) -> str:
    """How a session's turns reach the replica's attention-DP engines (the module docstring)."""
    dp = recipe.parallelism.attention_dp
    if dp == 1:
        return "one engine (no routing)"
    return (
        f"{dp} attention-DP engines, sessions routed prefix-aware (each session's turns to the "
        "engine holding its history)"
    )


def occupancy(
    recipe: Recipe, k: Kernels, m: ModelShape, kv: KVCost, c: int
) -> tuple[Serving, float, float]:
    """A turn of the session's mean prompt served beside `c` sessions, its service ms (TTFT and the
    rest of its answer) and the sessions running a turn at a time against the think time."""
    b = recipe.bench
    s = serve(k, m, kv, round(mean_prompt(recipe)), b.output_tokens, c, recipe.build.max_num_tokens)
    service_ms = s.ttft_ms + max(0, b.output_tokens - 1) * s.itl_ms
    return s, service_ms, c * service_ms / (service_ms + b.prefix.think_time_s * 1e3)


def admission_wait_ms(concurrency: int, fit: float, service_ms: float, think_ms: float) -> float:
    """A session's mean wait for admission in the closed loop (see the module docstring); at least
    one session runs (a pool that holds no whole session is the plan's refusal, not a wait)."""
    return max(0.0, concurrency * service_ms / max(1.0, fit) - service_ms - think_ms)


def prefill_ms(
    k: Kernels, m: ModelShape, kv: KVCost, new: int, cached: int, decoders: list[float], cap: int
) -> float:
    """The prefill of `new` tokens after `cached` ones, in chunks of at most `cap` tokens beside
    the decodes (trtkv.plan.speed.serve's chunking)."""
    if new <= 0:
        return 0.0
    n_chunks = math.ceil(new / cap)
    chunk = math.ceil(new / n_chunks)
    return sum(
        step_time(k, m, kv, decoders, chunk, cached + i * chunk).total_ms for i in range(n_chunks)
    )


def turn_ttft(
    k: Kernels,
    m: ModelShape,
    kv: KVCost,
    hits: TurnHits,
    osl: int,
    concurrency: int,
    budget: int,
    link: HostLink | None,
) -> tuple[float, float]:
    """(TTFT without reuse, with the turn's hits) in ms, both trtkv's model: the prefill of the
    missed tokens in place of the whole prompt's, plus the host hits' copy over the host link."""
    full = serve(k, m, kv, hits.prompt, osl, concurrency, budget).ttft_ms
    hit = int(hits.device + hits.host)
    decoders = [hits.prompt + osl / 2] * (concurrency - 1)
    cap = max(1, budget - (concurrency - 1))
    whole = prefill_ms(k, m, kv, hits.prompt, 0, decoders, cap)
    part = prefill_ms(k, m, kv, max(1, hits.prompt - hit), hit, decoders, cap)
    copy = 0.0
    if hits.host and link is not None:
        per_token = kv.seq_bytes(hits.prompt) / hits.prompt  # bytes per token per GPU
        copy = hits.host * per_token / (link.gb_per_s * 1e9) * 1e3
    return full, full * part / whole + copy


def turn_hits(
    recipe: Recipe,
    block: int,
    device: float,
    host: float,
    c: int,
    running: float,
    inclusive: bool,
) -> list[TurnHits]:
    """Per turn of a session, its tokens that hit per tier: `device` and `host` tokens per engine
    (`host` 0: no host tier), `c` sessions on the engine of which `running` run a turn at a time
    (admitted: at most those the pool holds, sessions_fit), the host tier `inclusive` of the device
    pool or exclusive (the module docstring's model)."""
    b, p = recipe.bench, recipe.bench.prefix
    turns = sessions(recipe)
    shared = p.shared_tokens
    context = round(mean_prompt(recipe)) + b.output_tokens / 2
    referenced = running * max(0.0, context - shared) + min(p.groups, running) * shared
    free = max(0.0, device - referenced)
    # content a finished turn frees into the LRU (its prefix stays with its group)
    freed = sum(t[0] + b.output_tokens for t in turns) / len(turns) - shared
    history_distance = c * (1 - running / c) * freed
    prefix_distance = 0.0 if running >= p.groups else p.groups * freed
    dev_p, dev_h = survives(free, prefix_distance), survives(free, history_distance)
    if inclusive:
        any_p = max(dev_p, survives(host, prefix_distance))
        any_h = max(dev_h, survives(host, history_distance))
    else:
        any_p = survives(free + host, prefix_distance)
        any_h = survives(free + host, history_distance)
    on = prefix_cache(recipe).enabled
    hits = []
    for prompt, pre, history in turns:
        cap_pre = block_floor(min(pre, prompt - 1), block)
        cap_all = block_floor(min(history, prompt - 1), block)
        rest = max(0, cap_all - cap_pre)
        dev = cap_pre * dev_p + rest * min(dev_h, dev_p)
        anywhere = cap_pre * any_p + rest * min(any_h, any_p)
        if not on:
            dev = anywhere = 0.0
        hits.append(TurnHits(prompt, dev, anywhere - dev if host else 0.0))
    return hits


def format_row(
    recipe: Recipe,
    label: str,
    kv: KVCost,
    k: Kernels,
    m: ModelShape,
    pool_bytes: float,
    tier: HostTier | None,
    concurrency: int,
) -> PrefixReuseRow:
    """One format at one concurrency level: hit rates per tier and the mean TTFT over a session's
    turns, without and with reuse."""
    b, p = recipe.bench, recipe.bench.prefix
    host_bytes = tier.bytes_per_replica / recipe.parallelism.gpus if tier is not None else 0.0
    block = max(1, memory_rule(recipe).block_tokens(recipe))
    turns = sessions(recipe)
    longest = p.longest_tokens(b.input_tokens, b.output_tokens)
    per_token = kv.seq_bytes(longest) / longest
    device = pool_bytes / per_token
    host = host_bytes / per_token
    c = rank_concurrency(concurrency, recipe.parallelism.attention_dp)
    budget = recipe.build.max_num_tokens
    s, _, running = occupancy(recipe, k, m, kv, c)
    think_ms = p.think_time_s * 1e3
    prompt = round(mean_prompt(recipe))
    context = prompt + b.output_tokens / 2
    shared = p.shared_tokens
    own = max(0.0, context - shared)
    on = prefix_cache(recipe).enabled
    # sessions the pool holds at once: with reuse (a group's prefix once) and without (each its
    # whole context)
    fit_none = device / context
    fit = sessions_fit(device, own, shared, p.groups) if on else fit_none
    admitted = min(running, fit)
    inclusive = tier is not None and tier.inclusive
    hits = turn_hits(recipe, block, device, host, c, admitted, inclusive)
    link = host_link_of(recipe.hardware.gpu)
    # a turn in service runs beside the sessions admitted with it (both TTFTs of a row)
    c_run = c if fit >= c else max(1, math.floor(fit))
    run = serve(k, m, kv, prompt, b.output_tokens, c_run, budget) if c_run != c else s
    decode_ms = max(0, b.output_tokens - 1) * run.itl_ms
    base, reused = 0.0, 0.0
    for h in hits:
        full, with_hits = turn_ttft(k, m, kv, h, b.output_tokens, c_run, budget, link)
        base += full / len(turns)
        reused += with_hits / len(turns)
    base += admission_wait_ms(c, fit_none, base + decode_ms, think_ms)
    reused += admission_wait_ms(c, fit, reused + decode_ms, think_ms)
    total = sum(h.prompt for h in hits)
    return PrefixReuseRow(
        format=label,
        concurrency=concurrency,
        device_tokens=int(device),
        host_tokens=int(host),
        working_set_tokens=int(p.groups * p.shared_tokens + c * (context - p.shared_tokens)),
        device_hit_rate=round(sum(h.device for h in hits) / total, 4),
        host_hit_rate=round(sum(h.host for h in hits) / total, 4),
        ttft_ms_without_reuse=round(base, 2),
        ttft_ms=round(reused, 2),
        source=k.source,
    )


def prefix_reuse(
    recipe: Recipe,
    pool_bytes: float,
    formats: list[tuple[str, KVCost]],
    k: Kernels,
    m: ModelShape,
) -> PrefixReuse | None:
    """The estimate's prefix-reuse section (None: the recipe sends no prefix workload)."""
    p = recipe.bench.prefix
    if not p.enabled:
        return None
    tier = host_tier(recipe)
    rows = [
        format_row(recipe, label, kv, k, m, pool_bytes, tier, c)
        for label, kv in formats
        for c in recipe.bench.concurrency
    ]
    link = host_link_of(recipe.hardware.gpu)
    pc = prefix_cache(recipe)
    return PrefixReuse(
        shared_tokens=p.shared_tokens,
        groups=p.groups,
        turns=p.turns,
        turn_tokens=p.turn_tokens,
        think_time_s=p.think_time_s,
        block_tokens=memory_rule(recipe).block_tokens(recipe),
        prefix_cache=pc.why,
        eviction=tier.reuse if tier is not None else "device pool only (no host tier set)",
        routing=f"one replica carries bench.concurrency; {routing(recipe)}",
        host_link=link.basis if link is not None else "none in the table",
        rows=rows,
    )


def reuse_lines(section: PrefixReuse) -> list[str]:
    """The estimate's text: the workload and its assumptions (one line, to wrap), then a table of
    the formats and levels."""
    sources = sorted({r.source for r in section.rows})
    head = (
        f"Prefix reuse (bench.prefix: {section.groups} shared prefix(es) of "
        f"{section.shared_tokens:,} tokens, {section.turns} turn(s) of +{section.turn_tokens:,} "
        f"tokens, think {section.think_time_s:g} s; blocks of {section.block_tokens} tokens; "
        f"prefix cache {section.prefix_cache}; {section.eviction}; {section.routing}; host link "
        f"{section.host_link}; both TTFTs of a row {' / '.join(sources)}):"
    )
    cols = ["format", "conc", "device tok", "host tok", "working set", "hit dev", "hit host"]
    cols += ["TTFT ms", "reused"]
    rows = [
        [
            r.format,
            str(r.concurrency),
            f"{r.device_tokens:,}",
            f"{r.host_tokens:,}",
            f"{r.working_set_tokens:,}",
            f"{r.device_hit_rate:.1%}",
            f"{r.host_hit_rate:.1%}",
            f"{r.ttft_ms_without_reuse:,.1f}",
            f"{r.ttft_ms:,.1f}",
        ]
        for r in section.rows
    ]
    widths = [max(len(x) for x in col) for col in zip(cols, *rows, strict=True)]
    return [head] + [
        "  "
        + "  ".join(
            x.rjust(w) if i else x.ljust(w)
            for i, (x, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in [cols, *rows]
    ]
