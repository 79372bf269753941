"""Which served engine has a KV tier beyond the device at trtkv's pins, and the rule that refuses a
tier (`triton.kv_host_tier_gib_per_replica`, `triton.kv_disk_tier_gib_per_replica`) the recipe's
engine or release does not serve, naming the one that does. The flags each engine takes live in
trtkv.engines.kv_tiers (validation runs below the engines' layer).

What each engine ships (read from its source at trtkv's pins):
- vLLM 0.32.0: `--kv-offloading-size` (GiB, summed over the TP ranks; vllm/config/cache.py
  CacheConfig.kv_offloading_size) with `--kv-offloading-backend native` (OffloadingConnector,
  `cpu_bytes_to_use = size * 2**30`, vllm/config/vllm.py _post_init_kv_transfer_config). Its disk
  tier is the TieringOffloadingSpec's `fs` secondary tier (vllm/v1/kv_offload/tiering/fs/
  manager.py FileSystemTierManager: a root_dir, no size), reached only through
  --kv-transfer-config: no sized disk tier.
- SGLang 0.5.23: `--enable-hierarchical-cache` with `--hicache-size` (an int, GB = 1e9 bytes, per
  rank: mem_cache/pool_host/base.py sizes `host_size * 1e9 // size_per_token` tokens in each
  rank's process) or `--hicache-ratio`; its storage backends (`--hicache-storage-backend file`:
  a directory from SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR, no size) give no sized disk tier.
- TensorRT-LLM 1.2.1 (the newest release in trtkv's matrix): LLM API
  `KvCacheConfig.host_cache_size` ("Size of the host cache in bytes", tensorrt_llm/llmapi/
  llm_args.py), the engine path's Triton parameters `kv_cache_host_memory_bytes` and
  `kv_cache_onboard_blocks` (tests/data/triton_tensorrt_llm_parameters.txt). Disk tiers
  (`disk_cache_size`, `disk_cache_path`) first appear in the 1.3.0rc27 KvCacheConfig reference
  (TensorRT-LLM's published LLM API docs, llm-api/reference/KvCacheConfig.html), NVFP4 cold pages
  and `host_cache_bind_to_gpu_numa_node` in 1.4.0rc4's: none in 1.2.1. (1.2.1's llm_args.py was not
  read at its tag: the repository's snapshot is too large to fetch here; host_cache_size is in
  every stored KvCacheConfig, and the engine path's parameter maps onto it.)
- Dynamo 1.4.0: KVBM host and disk tiers (DYN_KVBM_CPU_CACHE_GB, DYN_KVBM_DISK_CACHE_GB) behind
  its vLLM and TensorRT-LLM workers' KVBM connector; trtkv's Dynamo workers take the engine's own
  flags above (KVBM is not written yet), its SGLang workers use HiCache.
- trtkv's reference runtime: no second tier (a later change gives it one).
"""

from __future__ import annotations

from trtkv.platform.hardware import GPU
from trtkv.recipe.backend_rules import BACKEND_ROWS
from trtkv.recipe.enums import Backend
from trtkv.recipe.prefix_cache import prefix_cache
from trtkv.recipe.schema import Recipe
from trtkv.units import GB, GIB

HOST_FIELD = "triton.kv_host_tier_gib_per_replica"
DISK_FIELD = "triton.kv_disk_tier_gib_per_replica"

DISK_ELSEWHERE = (
    "a sized disk tier is served by Dynamo KVBM (DYN_KVBM_DISK_CACHE_GB) or TensorRT-LLM "
    ">= 1.3.0rc27, neither written by trtkv yet: remove it"
)


def sglang_gb_per_rank(gib_per_replica: float, gpus: int) -> int:
    """SGLang's --hicache-size: whole GB (1e9 bytes) per rank, rounded down from the replica's
    GiB spread over its GPUs."""
    return int(gib_per_replica * GIB / gpus // GB)


def problems(recipe: Recipe) -> list[tuple[str, str]]:
    """A host or disk tier the recipe's engine, release or hardware cannot serve."""
    t, backend = recipe.triton, recipe.build.backend
    out: list[tuple[str, str]] = []
    host = t.kv_host_tier_gib_per_replica
    if host is not None:
        if backend is Backend.REFERENCE:
            # the reference runtime's second tier (trtkv.runtime.block_reuse): blocks its device
            # pool evicts, in the same process's memory; it holds only reusable blocks
            reuse = prefix_cache(recipe)
            if not reuse.enabled:
                out.append(
                    (
                        HOST_FIELD,
                        f"{host:g}: the reference runtime's host tier holds reusable KV blocks, "
                        f"and block reuse is {reuse.why}: remove it, or turn reuse on",
                    )
                )
        elif recipe.hardware.gpu is GPU.CPU:
            out.append(
                (
                    HOST_FIELD,
                    f"{host:g}: on hardware.gpu cpu the KV pool already lives in host memory; a "
                    "host tier needs a GPU: remove it or set hardware.gpu",
                )
            )
        elif backend is Backend.SGLANG:
            gpus = recipe.parallelism.gpus
            if sglang_gb_per_rank(host, gpus) < 1:
                out.append(
                    (
                        HOST_FIELD,
                        f"{host:g} GiB over {gpus} GPU(s) is under 1 GB per rank; SGLang's "
                        "--hicache-size takes whole GB (1e9 bytes) per rank: raise it to at least "
                        f"{gpus * GB / GIB:.2f}",
                    )
                )
    disk = t.kv_disk_tier_gib_per_replica
    if disk is not None:
        why = BACKEND_ROWS[backend].no_disk_tier
        out.append((DISK_FIELD, f"{disk:g}: {why}; {DISK_ELSEWHERE}"))
    return out
