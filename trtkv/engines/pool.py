"""What every engine's memory rule shares: a pool's terms and estimate (`PoolEstimate`), the cap or
pin bound, the flags a served engine gets (`EngineKnobs`), the pool a running engine reports
(`ServedPool`), and the rule's signature (`PoolRule`, called with a `Sizing`); each engine's own
rule lives in its module beside this one (the package docstring).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from trtkv.engines.activation import ModelShape, Setup
from trtkv.platform.hardware import CUDA_CONTEXT_GIB
from trtkv.units import GIB

if TYPE_CHECKING:
    from trtkv.recipe import Recipe


# NCCL's NVLS buffers add ~2 GiB on NVSwitch systems ("Init torch distributed ends. mem usage=2.01
# GB" on 8x H200, sgl-project/sglang PR #11716); on PCIe ~0.13 GiB (QwQ-32B on L4). Engine
# constants, the same for every model.
NCCL_NVSWITCH_GIB = 2.0
NCCL_PCIE_GIB = 0.13


@dataclass(frozen=True)
class Term:
    """One figure of a pool's budget, in bytes, with what it is."""

    name: str
    bytes: float
    note: str


@dataclass(frozen=True)
class PoolEstimate:
    """The pool one engine allocates on one GPU, the rule that gives it and every term of that rule.

    `available_bytes` is what the rule leaves for KV before any cap and before block rounding (vLLM
    prints it as "Available KV cache memory"); `pool_bytes` is what is allocated: min(rule, cap) or
    the pin, in whole blocks."""

    engine: str
    version: str
    rule: str
    source: str
    knob: str  # the engine's own flag name
    knob_value: float
    knob_is_default: bool
    # util x total (vLLM), free before load x fraction (SGLang), free x fraction (TRT-LLM)
    budget_bytes: float
    terms: tuple[Term, ...]
    available_bytes: float
    pool_bytes: float
    # "rule", "cap" (kv_pool_gib_per_gpu lowered it) or "pin" (the engine took the size)
    bound: str = "rule"
    notes: tuple[str, ...] = field(default_factory=tuple)

    def term(self, name: str) -> float:
        for t in self.terms:
            if t.name == name:
                return t.bytes
        raise KeyError(name)


def apply_bound(
    est: PoolEstimate, cap_bytes: float | None, pins: bool, block_bytes: float
) -> PoolEstimate:
    """min(rule, cap) or the pin, in whole blocks of `block_bytes` (0: no rounding), and which bound
    applied."""
    pool, bound = max(0.0, est.available_bytes), "rule"
    if cap_bytes is not None and pins:
        pool, bound = cap_bytes, "pin"
    elif cap_bytes is not None and cap_bytes < pool:
        pool, bound = cap_bytes, "cap"
    if block_bytes > 0:
        pool = math.floor(pool / block_bytes) * block_bytes
    return replace(est, pool_bytes=pool, bound=bound)


def context_bytes(setup: Setup) -> float:
    """CUDA context + torch init + NCCL init on one GPU (an engine-independent process figure)."""
    nccl = (
        (NCCL_NVSWITCH_GIB if setup.nvswitch else NCCL_PCIE_GIB) if setup.tp * setup.pp > 1 else 0.0
    )
    return (CUDA_CONTEXT_GIB + nccl) * GIB


@dataclass(frozen=True)
class EngineKnobs:
    """The memory flags a served engine gets: its own knob (always passed, the default resolved) and
    the cap/pin."""

    flag: str | None  # None: the backend has no memory knob (the reference runtime)
    value: float | None
    is_default: bool
    cap_flag: str | None = None
    # bytes (vLLM --kv-cache-memory-bytes) or tokens (SGLang, TensorRT-LLM)
    cap_value: int | None = None

    @property
    def pins(self) -> bool:
        """The engine takes the cap as the pool's size (vLLM) rather than as an upper bound."""
        return self.cap_flag == "--kv-cache-memory-bytes"

    def args(self) -> list[str]:
        """The served command's memory flags: the knob with its value, and the cap/pin when set."""
        args = [str(self.flag), f"{self.value:g}"]
        if self.cap_flag is not None and self.cap_value is not None:
            args += [self.cap_flag, str(self.cap_value)]
        return args


@dataclass(frozen=True)
class ServedPool:
    """The KV pool a running engine reports on one GPU: bytes (tokens x bytes per token where it
    reports tokens), tokens when it says, and where the figure was read."""

    pool_bytes: float | None
    tokens: int | None
    source: str


@dataclass(frozen=True)
class Sizing:
    """What the planner read of the recipe's model for an engine's rule: the architecture figures
    activation depends on, one GPU as the engine sees it, and one sequence's bytes
    on the fullest GPU as the recipe's engine accounts them (for a context length)."""

    shape: ModelShape
    setup: Setup
    sequence_bytes: Callable[[int], float]


@dataclass(frozen=True)
class BatchLimit:
    """The most requests an engine runs at once where its command leaves the cap unset (its own
    default, read from its source), the flag or key the served command sets it with, and the
    source."""

    flag: str  # vLLM --max-num-seqs, SGLang --max-running-requests, TensorRT-LLM max_batch_size
    sequences: int
    source: str


@dataclass(frozen=True)
class TokenFacts:
    """What an engine's token count is made of, on the fullest GPU in one KV format: a token in
    every attention layer (the exact account's per-token figure), a token in the full-attention
    layers only (what a token adds beyond every window), one sequence's bytes at a context as the
    recipe's engine allocates them, the recipe's max_seq_len and the model's config model_type."""

    every_layer_bytes: float
    full_layers_bytes: float
    sequence_bytes: Callable[[int], float]
    max_seq_len: int
    model_type: str


@dataclass(frozen=True)
class EngineTokens:
    """The bytes one token of an engine's printed token count stands for on one GPU, and the rule
    (its source) that makes it."""

    bytes_per_token: float
    rule: str


# An engine's pool rule at trtkv's pinned release: the recipe, its sizing, and the flags its served
# command carries (the backend's MemoryRule.knobs) -> the pool on each GPU.
PoolRule = Callable[["Recipe", Sizing, EngineKnobs], PoolEstimate]
