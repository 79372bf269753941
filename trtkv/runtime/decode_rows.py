"""A decode step's weight groups: each layer's q/k/v projections as one matrix, and its MLP's
gate/up as another, so a decode block runs one one-row product per group (trtkv.runtime.invariant
decode_linear) instead of three or two. On the CPU a decode step of a small model is as much call
overhead as weight traffic (issue #57: SmolLM2-135M spends ~25 of ~65 ms a token outside its
products); the bytes read stay the same.

The modules' weights become row views of the group's matrix (nothing is held twice, and a prefill's
F.linear on a module reads the same numbers from it). A row's output of the group's product depends
on that row only, as every decode_linear does, so batch invariance holds whatever the rows are (and
on the CPUs measured the group's columns equal the separate products bit for bit). Modules that are
not plain nn.Linear of one dtype and input width, or whose biases are mixed, stay separate (None).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Group:
    """Several linears over the same input as one (sum of outputs, D) weight; `sizes` their output
    widths in order."""

    weight: Any
    bias: Any
    sizes: tuple[int, ...]


DECODE_ROWS = 8  # decode rows per block: one sequence per row
VOCAB_CHUNK = 8192  # LM-head weight rows per call
_ROWS_OK: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
_GROUPS: weakref.WeakKeyDictionary[Any, list[tuple[Group | None, Group | None]]] = (
    weakref.WeakKeyDictionary()
)


def layer_groups(model: Any) -> list[tuple[Group | None, Group | None]]:
    """Per decoder layer: (its q/k/v group, its gate/up group), made once per model, which also lays
    every plain linear's weight and the LM head's out column-major (_columns): call it before any
    kernel check or forward of the model, so that all of them see one layout."""
    cached = _GROUPS.get(model)
    if cached is None:
        cached = [
            (
                _fuse([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj]),
                _fuse([layer.mlp.gate_proj, layer.mlp.up_proj]),
            )
            for layer in model.model.layers
        ]
        _column_major(model)
        _GROUPS[model] = cached
    return cached


def _column_major(model: Any) -> None:
    """The linears not fused into a group (o_proj, down_proj, ...) and the LM head stored (D, out)
    column-major. A tied embedding stays tied (one weight, as the export says): its rows are then
    strided, ~4 µs more a token to gather (4,096 tokens: 44 vs 26 ms on one core), next to the
    milliseconds a token of a prefill's products."""
    import torch

    for layer in model.model.layers:
        for m in layer.modules():
            if type(m) is torch.nn.Linear and not _is_column_major(m.weight):
                _columns([m])
    head = model.lm_head
    if type(head) is torch.nn.Linear and not _is_column_major(head.weight):
        _columns([head])


def _is_column_major(weight: Any) -> bool:
    return bool(weight.dim() == 2 and weight.stride(0) == 1 and weight.shape[1] > 1)


def _columns(mods: list[Any]) -> Any:
    """One (D, sum of outputs) contiguous matrix holding the modules' weights side by side, each
    module's (out, D) weight a view of its columns; returns the (sum of outputs, D) view.

    A decode row's product then reads the weight as x (1, D) @ (D, out), MKL's column-form
    matrix-vector kernel (the weight streamed row by row, no horizontal sums): ~16-18 GB/s of
    float32 weights on one core of the AMD EPYC measured against ~12 GB/s for the (out, D) form
    (issue #57), for SmolLM2-135M's shapes. Each output is still one row's own sum, the same
    whatever other rows the call holds (rows_ok checks it on this layout)."""
    import torch

    # plain tensors, as the modules' own (made during an inference-mode step)
    with torch.inference_mode(False), torch.no_grad():
        weight = torch.cat([m.weight for m in mods]).t().contiguous()
        col = 0
        for m in mods:
            n = m.weight.shape[0]
            m.weight.data = weight[:, col : col + n].t()
            col += n
    return weight.t()


def _fuse(mods: list[Any]) -> Group | None:
    import torch

    first = mods[0].weight
    if any(
        type(m) is not torch.nn.Linear
        or m.weight.dtype != first.dtype
        or m.weight.shape[1] != first.shape[1]
        for m in mods
    ):
        return None
    biased = [m.bias is not None for m in mods]
    if any(biased) and not all(biased):
        return None
    sizes = tuple(m.weight.shape[0] for m in mods)
    with torch.inference_mode(False), torch.no_grad():
        bias = torch.cat([m.bias for m in mods]) if all(biased) else None
        row = 0
        for m in mods:
            if bias is not None:
                m.bias.data = bias[row : row + m.weight.shape[0]]
            row += m.weight.shape[0]
    return Group(_columns(mods), bias, sizes)


def rows_ok(model: Any) -> bool:
    """Whether a batched one-row product (torch.bmm of (n, 1, D) rows against the shared weight),
    the RMS norm and the activation give each row bit-equal to that row alone (n = 1, the one-row
    product torch.mm of a (1, D) row): checked once per model on its own weights, the groups' and
    the LM head's included, in their decode layout (else decode blocks keep DECODE_ROWS rows, the
    empty ones zero, and decode_linear runs the live rows one call each)."""
    import torch

    cached = _ROWS_OK.get(model)
    if cached is not None:
        return cached
    groups = layer_groups(model)  # the weights' layout first
    gen = torch.Generator().manual_seed(0)
    layer = model.model.layers[0]
    weights = [*layer_linears(layer).values(), model.lm_head.weight[:VOCAB_CHUNK]]
    weights += [g.weight for g in groups[0] if g is not None]
    ok = True
    with torch.inference_mode():
        for weight in weights:
            x = torch.randn(DECODE_ROWS, weight.shape[1], generator=gen)
            t = weight.t()
            whole = torch.bmm(x[:, None], t.expand(DECODE_ROWS, *t.shape))[:, 0]
            for j in range(DECODE_ROWS):
                ok = ok and torch.equal(torch.mm(x[j : j + 1], t), whole[j : j + 1])
        # a decode block's norms and activations run on its n rows: each row as it comes out alone
        h = torch.randn(DECODE_ROWS, layer.input_layernorm.weight.shape[0], generator=gen)
        for fn in (layer.input_layernorm, layer.mlp.act_fn):
            whole = fn(h)
            ok = ok and all(torch.equal(fn(h[j : j + 1]), whole[j : j + 1]) for j in range(len(h)))
    _ROWS_OK[model] = ok
    return ok


def decode_linear(model: Any, weight: Any, bias: Any, h: torch.Tensor, n: int) -> torch.Tensor:
    """A decode block's linear: rows 0..n-1 of h (W, D), each a one-row product (the matrix-vector
    kernel, whatever n is), the rows past n zero. A one-row product reads the weight once and costs
    ~1/2 of a W-row GEMM on the CPU (MKL packs the weight for M > 1): a sequence decoding alone pays
    one row, not DECODE_ROWS, in one torch.mm call."""
    import torch

    t = weight.t()
    if n == h.shape[0] == 1:  # a sequence decoding alone
        out = torch.mm(h, t)
        return out if bias is None else out + bias
    if n == h.shape[0] and rows_ok(model):  # a decode block: its rows are all live
        out = torch.bmm(h[:, None], t.expand(n, *t.shape))[:, 0]
        return out if bias is None else out + bias
    out = h.new_zeros(h.shape[0], weight.shape[0])
    if n:
        if n > 1 and rows_ok(model):
            out[:n] = torch.bmm(h[:n, None], t.expand(n, *t.shape))[:, 0]
        else:
            for j in range(n):
                out[j : j + 1] = torch.mm(h[j : j + 1], t)
        if bias is not None:
            out[:n] += bias
    return out


def layer_linears(layer: Any) -> dict[tuple[int, ...], Any]:
    """A decoder layer's linear weights, one per shape: what the once-per-model kernel checks run
    on."""
    import torch

    return {
        tuple(m.weight.shape): m.weight for m in layer.modules() if isinstance(m, torch.nn.Linear)
    }
