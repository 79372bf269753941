"""This machine's own memory: where a probe offloads layers, and the CPU recipe's 'device' memory
for the planner (the planner reads host_memory_gib; vLLM CPU's pool reads the memory node,
trtkv.engines.vllm_cpu)."""

from __future__ import annotations

import os

from trtkv.platform.hardware import GIB


def host_memory_bytes() -> float | None:
    """Total RAM of this machine in bytes (None where the OS does not say)."""
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def host_memory_gib() -> float | None:
    """Total RAM of this machine in GiB (the CPU recipe's 'device' memory; None where the OS does
    not say)."""
    total = host_memory_bytes()
    return None if total is None else total / GIB
