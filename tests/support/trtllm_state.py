"""An HF Llama state dict in TensorRT-LLM's checkpoint layout (unquantized): the inverse of
trtkv.runtime.checkpoint.trtllm_to_hf_state_dict, for writing small TensorRT-LLM checkpoints in tests."""

from __future__ import annotations

from typing import Any

import torch

from trtkv.runtime.checkpoint import GLOBAL_NAMES, LAYER_NAMES


def hf_to_trtllm_state_dict(state_dict: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for src, dst in GLOBAL_NAMES.items():
        if f"{dst}.weight" in state_dict:
            out[f"{src}.weight"] = state_dict[f"{dst}.weight"]
    for i in range(config.num_hidden_layers):
        pre, hf = f"transformer.layers.{i}.", f"model.layers.{i}."
        for src, dst in LAYER_NAMES.items():
            out[f"{pre}{src}.weight"] = state_dict[f"{hf}{dst}.weight"]
        out[f"{pre}attention.qkv.weight"] = torch.cat(
            [state_dict[f"{hf}self_attn.{p}_proj.weight"] for p in "qkv"], dim=0
        )
    return {k: v.contiguous() for k, v in out.items()}
