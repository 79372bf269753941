"""What one server pod (or Slurm node) asks of its node besides GPUs, and how long its probes wait,
sized from the model and the recipe. Every figure is a rule stated here, not a measurement;
docs/deploy.md explains each one and says that none was run on a cluster.

- memory: one copy of the pod's weights in flight while loading (an engine file or a safetensors
  shard passes through host memory on its way to the GPU) + HOST_GIB_PER_RANK per GPU process (CUDA
  context, NCCL, the Python runtime) + the memory-backed /dev/shm (it counts against the limit) +
  BASE_HOST_GIB + the pod's share of the replica's host KV tier
  (`triton.kv_host_tier_gib_per_replica` as its engine pins it, trtkv.engines.kv_tiers); the limit
  adds a quarter for page cache and tokenizer workers.
- CPU: CPU_PER_GPU cores per GPU rank + CPU_BASE for the HTTP front end and tokenization; the limit
  is twice that.
- ephemeral storage: the writable emptyDirs (HOME's kernel/JIT caches, /tmp, logs).
- startup budget: the pod's weights read at half `triton.storage_read_gbps` plus
  `triton.engine_init_s`, plus the wait for the other pods of a multi-node replica.
- readiness canary timeout: a loaded server takes a new one-token request once an in-flight request
  of bench.output_tokens finishes; twice the plan's decode-step lower bound for that many tokens,
  plus 10 s, and at least the canary's default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from trtkv.backends import for_recipe
from trtkv.contracts.canary import CANARY_TIMEOUT_S
from trtkv.deploy.sizing import Sizing
from trtkv.engines import HostTier
from trtkv.recipe import Recipe
from trtkv.units import GIB

HOST_GIB_PER_RANK = 4.0  # per GPU process: CUDA context, NCCL buffers, the Python/torch runtime
BASE_HOST_GIB = 4.0  # the server's front end, tokenizer, logs
LIMIT_OVER_REQUEST = 1.25  # page cache and tokenizer workers above the request
CPU_PER_GPU = 2
CPU_BASE = 2
EPHEMERAL_REQUEST_GIB = 10
EPHEMERAL_LIMIT_GIB = 40
# the startup budget allows the weights' read at half the recipe's storage bandwidth
LOAD_SLOWDOWN = 2.0
STARTUP_PERIOD_S = 10
SLOW_STEP_FACTOR = 2.0  # the plan's decode step is a lower bound (HBM bandwidth only)


@dataclass(frozen=True)
class PodResources:
    """requests and limits of one container (cores, GiB) and its memory-backed /dev/shm."""

    cpu_request: float
    cpu_limit: float
    memory_request_gib: float
    memory_limit_gib: float
    ephemeral_request_gib: float
    ephemeral_limit_gib: float
    shm_gib: int = 0
    gpus: int = 0

    def k8s(self) -> dict[str, Any]:
        """The container's `resources`."""
        req: dict[str, Any] = {
            "cpu": _cpu(self.cpu_request),
            "memory": _bytes(self.memory_request_gib),
            "ephemeral-storage": _bytes(self.ephemeral_request_gib),
        }
        lim: dict[str, Any] = {
            "cpu": _cpu(self.cpu_limit),
            "memory": _bytes(self.memory_limit_gib),
            "ephemeral-storage": _bytes(self.ephemeral_limit_gib),
        }
        if self.gpus:
            req["nvidia.com/gpu"] = lim["nvidia.com/gpu"] = self.gpus
        return {"requests": req, "limits": lim}


def _cpu(cores: float) -> str | int:
    return int(cores) if float(cores).is_integer() else f"{int(cores * 1000)}m"


def _bytes(gib: float) -> str:
    return f"{int(gib)}Gi" if float(gib).is_integer() else f"{math.ceil(gib * 1024)}Mi"


def host_tier(recipe: Recipe) -> HostTier | None:
    """The recipe's host KV tier as its backend's engine is told it (None: none)."""
    rule = for_recipe(recipe).memory
    return rule.host_tier(recipe) if rule is not None and rule.host_tier is not None else None


def host_tier_gib_per_pod(recipe: Recipe, sizing: Sizing) -> float:
    """The pinned host memory of the replica's host KV tier one pod (node) holds, in GiB: the bytes
    its engine allocates (its unit and rounding), spread evenly over the replica's nodes."""
    tier = host_tier(recipe)
    if tier is None:
        return 0.0
    return tier.bytes_per_replica / GIB / sizing.nodes_per_replica


def server_resources(sizing: Sizing, shm_gib: int, host_tier_gib: float = 0.0) -> PodResources:
    """One server pod (one node of a replica): its GPUs' ranks, its shard of the weights, its
    /dev/shm, its share of the host KV tier (pinned: inside the request and the limit)."""
    ranks = sizing.gpus_per_pod
    host = (
        sizing.weights_gib_per_pod
        + HOST_GIB_PER_RANK * ranks
        + shm_gib
        + BASE_HOST_GIB
        + host_tier_gib
    )
    cpu = CPU_PER_GPU * ranks + CPU_BASE
    return PodResources(
        cpu,
        2 * cpu,
        math.ceil(host),
        math.ceil(host * LIMIT_OVER_REQUEST),
        EPHEMERAL_REQUEST_GIB,
        EPHEMERAL_LIMIT_GIB,
        shm_gib,
        ranks,
    )


# Small helpers' containers: the loader Job (a storage CLI), the init container waiting for the
# load, a frontend
LOADER = PodResources(1, 2, 1, 2, 2, 8)
WAITER = PodResources(0.05, 0.2, 0.0625, 0.125, 0.0625, 0.125)
FRONTEND = PodResources(2, 4, 4, 8, 2, 8)


def load_seconds(recipe: Recipe, sizing: Sizing) -> float:
    """Reading the pod's weights at the recipe's storage bandwidth (GB/s, 10^9 bytes)."""
    return sizing.weights_gib_per_pod * GIB / (recipe.triton.storage_read_gbps * 1e9)


def startup_budget_s(recipe: Recipe, sizing: Sizing, extra_s: float = 0.0) -> int:
    """Seconds the startup probe allows before the kubelet restarts the container: the weights read
    at half the recipe's bandwidth, the engine's initialization, and `extra_s` (the wait for a
    multi-node replica's other pods)."""
    return math.ceil(
        LOAD_SLOWDOWN * load_seconds(recipe, sizing) + recipe.triton.engine_init_s + extra_s
    )


def canary_timeout_s(recipe: Recipe, sizing: Sizing) -> int:
    """The readiness canary's whole-request deadline: long enough for a loaded server to admit a
    one-token request."""
    wait_s = SLOW_STEP_FACTOR * recipe.bench.output_tokens * sizing.decode_step_ms / 1000
    return max(int(CANARY_TIMEOUT_S), math.ceil(wait_s + 10))


def lines(
    recipe: Recipe, sizing: Sizing, res: PodResources, budget_s: int, canary_s: int
) -> list[str]:
    """The README's account of each figure."""
    t = recipe.triton
    return [
        f"- Memory {res.memory_request_gib} GiB requested, {res.memory_limit_gib} GiB limit: the "
        f"pod's weights ({sizing.weights_gib_per_pod:.1f} GiB, one copy in flight while loading) + "
        f"{HOST_GIB_PER_RANK:g} GiB per GPU process x {res.gpus} + /dev/shm {res.shm_gib} GiB "
        f"(memory-backed, counted) + {BASE_HOST_GIB:g} GiB"
        + _tier_text(recipe, sizing)
        + f"; the limit x {LIMIT_OVER_REQUEST:g}.",
        f"- CPU {res.cpu_request:g} requested ({CPU_PER_GPU} per GPU + {CPU_BASE}), "
        f"{res.cpu_limit:g} limit; ephemeral storage "
        f"{res.ephemeral_request_gib}/{res.ephemeral_limit_gib} GiB (HOME caches, /tmp, logs).",
        f"- Startup probe: up to {budget_s} s = 2 x the pod's weights at triton.storage_read_gbps "
        f"{t.storage_read_gbps:g} GB/s ({load_seconds(recipe, sizing):.0f} s) + "
        f"triton.engine_init_s {t.engine_init_s:g} s"
        + (" + the wait for the other pods" if sizing.nodes_per_replica > 1 else "")
        + f"; checked every {STARTUP_PERIOD_S} s on the engine's own health endpoint.",
        f"- Readiness: the one-token canary with a {canary_s} s deadline (a loaded server admits "
        f"it once an in-flight request of bench.output_tokens {recipe.bench.output_tokens} "
        f"finishes: 2 x the plan's decode-step bound {sizing.decode_step_ms:.1f} ms per token, + "
        "10 s); three misses take the pod out of the Service.",
    ]


def _tier_text(recipe: Recipe, sizing: Sizing) -> str:
    tier = host_tier(recipe)
    if tier is None:
        return ""
    return (
        f" + the host KV tier {host_tier_gib_per_pod(recipe, sizing):.1f} GiB pinned "
        f"({tier.served}: {tier.scope}; NUMA: {tier.numa})"
    )
