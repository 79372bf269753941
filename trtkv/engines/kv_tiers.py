"""Each engine's KV tier beyond the device, as its served command or config carries it: the recipe's
`triton.kv_host_tier_gib_per_replica` in the engine's own unit and scope, the pinned host bytes one
replica then holds (what a deployment adds to its memory request), and whether the engine binds
its tier to a NUMA node. Which engine has one, and the refusals, are trtkv.recipe.kv_tiers' (its
docstring cites each engine's source at trtkv's pins).

Units and scopes, per engine:
- vLLM 0.32.0 `--kv-offloading-size`: GiB per engine, summed over its TP (and PP) ranks
  (CacheConfig.kv_offloading_size; `cpu_bytes_to_use = size * 2**30`). Under attention DP each DP
  engine core is its own engine: it gets the replica's GiB / attention_dp.
- SGLang 0.5.23 `--hicache-size`: whole GB (1e9 bytes) per rank (each rank's host pool).
- TensorRT-LLM 1.2.1 `kv_cache_config.host_cache_size` (LLM API) and the engine path's
  `kv_cache_host_memory_bytes`: bytes per rank (each rank's KV cache manager holds its own secondary
  pool: an assumption from the per-rank KvCacheConfig, stated here).
Host memory layout: each engine copies device blocks to host as they are (vLLM's
CPUOffloadingSpec sizes chunks from `worker_kv_bytes_per_block`, SGLang's host pool from the device
pool's dtype, TensorRT-LLM's secondary pool from the primary pool's block size), so a token costs
the same bytes in host memory as in the device pool, in each KV format.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trtkv.recipe import Recipe
from trtkv.recipe.kv_tiers import sglang_gb_per_rank
from trtkv.units import GB, GIB

# the engines' own names (the recipe field's one home for its flags)
VLLM_SIZE_FLAG = "--kv-offloading-size"
VLLM_BACKEND_FLAG = "--kv-offloading-backend"
VLLM_BACKEND = (
    "native"  # vLLM's OffloadingConnector; lmcache needs its own server (size not passed)
)
SGLANG_ENABLE_FLAG = "--enable-hierarchical-cache"
SGLANG_SIZE_FLAG = "--hicache-size"
LLMAPI_HOST_KEY = "host_cache_size"  # kv_cache_config.host_cache_size
ENGINE_HOST_PARAM = "kv_cache_host_memory_bytes"
ENGINE_ONBOARD_PARAM = "kv_cache_onboard_blocks"
# NUMA binding each engine offers for its host tier
VLLM_NUMA = (
    "vLLM 0.32.0 offers --numa-bind (ParallelConfig.numa_bind: each GPU worker under numactl on "
    "its GPU's node), but it raises at start when numactl is not on PATH or the GPU-to-NUMA "
    "topology is not detectable (vllm/utils/numa_utils.py); trtkv does not pass it until the "
    "served image is checked for numactl: add it, or bind the container (k8s Topology Manager "
    "single-numa-node, Slurm --cpu-bind/--mem-bind)"
)
SGLANG_NUMA = (
    "SGLang 0.5.23 detects each rank's NUMA node itself when --numa-node is unset "
    "(arg_groups/fields/device.py): no flag needed"
)
LLMAPI_NUMA = (
    "TensorRT-LLM 1.2.1 offers no NUMA option for host_cache_size "
    "(host_cache_bind_to_gpu_numa_node arrives in 1.4.0rc4): bind the process"
)
ENGINE_NUMA = "the Triton tensorrtllm backend offers no NUMA option: bind the process"
# how each engine's host tier relates to its device pool (trtkv.plan.prefix_reuse's model)
VLLM_REUSE = (
    "vLLM 0.32.0 OffloadingConnector (native): every computed block stored to CPU as it is "
    "computed, CPU LRU (v1/kv_offload/cpu.py); the host holds a superset of the device"
)
SGLANG_REUSE = (
    "SGLang 0.5.23 HiCache: write-through to the host pool (--hicache-write-policy default), host "
    "LRU; the host holds a superset of the device"
)
TRTLLM_REUSE = (
    "TensorRT-LLM 1.2.1 secondary pool: a reusable block the device pool evicts is offloaded to "
    "the host and onboarded on reuse (kv_cache_onboard_blocks); the two hold different blocks"
)


@dataclass(frozen=True)
class HostTier:
    """One replica's host KV tier as its engine is told it (a backend's MemoryRule.host_tier)."""

    engine: str
    # pinned host bytes the replica holds (every rank's share, summed)
    bytes_per_replica: int
    # what the served command or config carries, as a user reads it
    served: str
    # the engine's unit and scope
    scope: str
    numa: str
    # how it relates to the device pool, in the engine's words: a superset stored as blocks are
    # computed (inclusive) or the blocks the device pool evicts (exclusive)
    reuse: str
    inclusive: bool


def vllm_host_tier(recipe: Recipe) -> HostTier | None:
    """vLLM's host tier: GiB per engine (each attention-DP engine core its share)."""
    gib, p = recipe.triton.kv_host_tier_gib_per_replica, recipe.parallelism
    if gib is None:
        return None
    per_engine = gib / p.attention_dp
    split = f" (the replica's {gib:g} GiB over {p.attention_dp} DP engines)"
    return HostTier(
        "vllm",
        int(per_engine * GIB) * p.attention_dp,
        " ".join(vllm_tier_args(recipe)),
        "GiB per engine, summed over its TP ranks" + (split if p.attention_dp > 1 else ""),
        VLLM_NUMA,
        VLLM_REUSE,
        inclusive=True,
    )


def sglang_host_tier(recipe: Recipe) -> HostTier | None:
    """SGLang's HiCache host pool: whole GB per rank."""
    gib, p = recipe.triton.kv_host_tier_gib_per_replica, recipe.parallelism
    if gib is None:
        return None
    gb = sglang_gb_per_rank(gib, p.gpus)
    return HostTier(
        "sglang",
        gb * GB * p.gpus,
        " ".join(sglang_tier_args(recipe)),
        f"whole GB (1e9 bytes) per rank, {p.gpus} rank(s)",
        SGLANG_NUMA,
        SGLANG_REUSE,
        inclusive=True,
    )


def _trtllm_tier(recipe: Recipe, engine: str, name: str, numa: str) -> HostTier | None:
    per_rank, gpus = trtllm_host_bytes_per_rank(recipe), recipe.parallelism.gpus
    if per_rank is None:
        return None
    served, scope = f"{name}: {per_rank}", f"bytes per rank, {gpus} rank(s)"
    return HostTier(engine, per_rank * gpus, served, scope, numa, TRTLLM_REUSE, inclusive=False)


def llmapi_host_tier(recipe: Recipe) -> HostTier | None:
    """TensorRT-LLM's LLM API secondary pool: kv_cache_config.host_cache_size, bytes per rank."""
    return _trtllm_tier(recipe, "trtllm", f"kv_cache_config.{LLMAPI_HOST_KEY}", LLMAPI_NUMA)


def engine_host_tier(recipe: Recipe) -> HostTier | None:
    """The engine path's secondary pool: kv_cache_host_memory_bytes, bytes per rank."""
    return _trtllm_tier(recipe, "tensorrt", ENGINE_HOST_PARAM, ENGINE_NUMA)


def vllm_tier_args(recipe: Recipe) -> list[str]:
    """vLLM's offloading flags for the recipe's host tier (none without one)."""
    gib = recipe.triton.kv_host_tier_gib_per_replica
    if gib is None:
        return []
    per_engine = gib / recipe.parallelism.attention_dp
    return [VLLM_SIZE_FLAG, f"{per_engine:g}", VLLM_BACKEND_FLAG, VLLM_BACKEND]


def vllm_with_offload(recipe: Recipe, connector: dict[str, Any]) -> dict[str, Any]:
    """A --kv-transfer-config that keeps `connector` (Dynamo's NIXL between prefill and decode)
    beside the host tier: vLLM 0.32.0's --kv-offloading-size replaces any configured kv_connector
    with its OffloadingConnector (VllmConfig._post_init_kv_transfer_config), so a worker that
    already has a connector gets a MultiConnector of both (loads from the first that has a block,
    saves to all: distributed/kv_transfer/kv_connector/v1/multi_connector.py), with
    cpu_bytes_to_use as --kv-offloading-size sets it. Without a tier: `connector` unchanged."""
    gib = recipe.triton.kv_host_tier_gib_per_replica
    if gib is None:
        return connector
    offload = {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "cpu_bytes_to_use": int(gib / recipe.parallelism.attention_dp * GIB)
        },
    }
    return {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"connectors": [connector, offload]},
    }


def without_vllm_size(recipe: Recipe, args: list[str]) -> list[str]:
    """`args` less --kv-offloading-size and --kv-offloading-backend (for a command whose
    --kv-transfer-config carries the tier: vllm_with_offload)."""
    tier = vllm_tier_args(recipe)
    if not tier:
        return args
    i = args.index(VLLM_SIZE_FLAG)
    return args[:i] + args[i + 4 :]


def sglang_tier_args(recipe: Recipe) -> list[str]:
    """SGLang's HiCache flags for the recipe's host tier (none without one)."""
    gib = recipe.triton.kv_host_tier_gib_per_replica
    if gib is None:
        return []
    gb = sglang_gb_per_rank(gib, recipe.parallelism.gpus)
    return [SGLANG_ENABLE_FLAG, SGLANG_SIZE_FLAG, str(gb)]


def trtllm_host_bytes_per_rank(recipe: Recipe) -> int | None:
    """TensorRT-LLM's host_cache_size / kv_cache_host_memory_bytes: bytes per rank (None: no
    tier)."""
    gib = recipe.triton.kv_host_tier_gib_per_replica
    return None if gib is None else int(gib * GIB) // recipe.parallelism.gpus


def llmapi_tier_config(recipe: Recipe) -> dict[str, int]:
    """The kv_cache_config entries of the recipe's host tier (none without one)."""
    per_rank = trtllm_host_bytes_per_rank(recipe)
    return {} if per_rank is None else {LLMAPI_HOST_KEY: per_rank}


def engine_tier_params(recipe: Recipe) -> dict[str, str]:
    """The engine path's Triton parameters of the host tier: kv_cache_host_memory_bytes and
    kv_cache_onboard_blocks (true: TensorRT-LLM's default, a reused block returns to the device),
    both empty (unset) without one."""
    per_rank = trtllm_host_bytes_per_rank(recipe)
    if per_rank is None:
        return {ENGINE_HOST_PARAM: "", ENGINE_ONBOARD_PARAM: ""}
    return {ENGINE_HOST_PARAM: str(per_rank), ENGINE_ONBOARD_PARAM: "true"}
