"""This machine's own memory (where a probe offloads layers, where the CPU recipe runs)."""

from __future__ import annotations

import os


def host_memory_bytes() -> float | None:
    """Total RAM of this machine in bytes (None where the OS does not say)."""
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None
