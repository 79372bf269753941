"""The reference runtime's decode layout (issue #57): every linear's weight and the LM head's are stored column-major
(D, out) before the first product, so a decode row runs MKL's column-form matrix-vector kernel (faster on the CPUs
measured), with the same values, the modules' weights views of it, and a tied embedding still tied."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.runtime.test_runtime import tiny_llama, write_checkpoint, write_engine


@pytest.fixture(autouse=True)
def _single_thread(one_torch_thread: None) -> None:
    """Tiny models run fastest single-threaded (shared fixture in tests/conftest.py)."""


def _runtime(tmp: Path, tied: bool) -> tuple[Any, Any]:
    from trtkv.runtime import ReferenceRuntime

    model = tiny_llama(seed=3)
    ckpt = write_checkpoint(model, tmp / "checkpoint")
    rt = ReferenceRuntime.load(write_engine(ckpt, tmp / "engine", model))
    if tied:  # as trtkv.runtime.checkpoint.build_model ties a checkpoint without lm_head.weight
        rt.model.lm_head.weight = rt.model.model.embed_tokens.weight
        model.lm_head.weight = model.model.embed_tokens.weight
    return model, rt


@pytest.mark.parametrize("tied", [False, True])
def test_decode_weights_are_column_major_with_the_same_values(tmp_path: Path, tied: bool) -> None:
    from trtkv.runtime.decode_rows import decode_linear, layer_groups

    model, rt = _runtime(tmp_path, tied)
    tokens = rt.generate([5, 9, 17, 33], max_tokens=6)  # a prefill and decode steps: the layout is in place
    linears = {name: m for name, m in rt.model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert len(linears) == 7 * 2 + 1
    want = model.state_dict()
    for name, m in linears.items():
        assert m.weight.stride(0) == 1, f"{name}: stride {m.weight.stride()}, not column-major"
        assert torch.equal(m.weight, want[f"{name}.weight"]), name
    assert (rt.model.lm_head.weight is rt.model.model.embed_tokens.weight) == tied
    for qkv, up in layer_groups(rt.model):
        assert qkv is not None and up is not None and qkv.weight.t().is_contiguous() and up.weight.t().is_contiguous()
    # the layout changes which kernel sums a row, not what it computes: float32 rounding apart
    x = torch.randn(1, 64, generator=torch.Generator().manual_seed(0))
    w = rt.model.lm_head.weight
    torch.testing.assert_close(decode_linear(rt.model, w, None, x, 1), x @ want["lm_head.weight"].t())
    assert tokens == rt.generate([5, 9, 17, 33], max_tokens=6)  # the layout is made once: a second run is the same
