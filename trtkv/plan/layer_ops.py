"""The kernels one decoder layer launches, by its structure (issue #49): each GEMM call and each
elementwise kernel carries a fixed cost the step model prices per call (speed.step_time), so a layer
that runs more of them costs more at a small batch whatever its bytes.

Counted as aiconfigurator-core 0.12.0 lists a layer's generation ops (sdk/models/llama.py, moe.py,
deepseek.py; the kernel tables' own op lists):
- attention, GQA/MHA: the fused QKV projection and the output projection (2 GEMMs); MLA (DeepSeek):
  the down-projection of q and the KV latent in one GEMM, q's up-projection, the absorbed K
  product before attention and the absorbed V product after it (MLABmm pre/post), and the output
  projection (5), plus q's latent RMSNorm (`q_a_layernorm`: 1 more elementwise kernel);
- MLP: a dense layer's gate/up and down (2 GEMMs, 1 SiLU-and-mul); a MoE layer's router (1 GEMM;
  the routed experts are the fused MoE op, priced by trtkv.plan.moe_step with its own fixed cost),
  plus the shared experts' gate/up and down and their SiLU-and-mul where the model has them;
- per layer besides: input RMSNorm, RoPE, KV-cache write, post-attention RMSNorm with its residual.
A dense GQA layer is 4 GEMMs and 5 kernels (speed.GEMMS_PER_LAYER, speed.ELEMENTWISE_KERNELS).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trtkv.plan.model import Architecture

ATTENTION_GEMMS = {"gqa": 2, "mla": 5}
MLA_KERNELS = 1  # q_a_layernorm
DENSE_MLP_GEMMS = 2
ROUTER_GEMMS = 1
SHARED_EXPERT_GEMMS = 2
LAYER_KERNELS = 4  # input norm, RoPE, KV-cache write, post-attention norm + residual
ACTIVATION_KERNELS = 1  # SiLU-and-mul of a dense MLP or the shared experts


def layer_ops(arch: Architecture) -> tuple[float, float]:
    """(GEMM calls, elementwise kernels) per layer, averaged over the model's layers."""
    layers = max(1, arch.num_layers)
    moe = arch.moe
    moe_layers = len(moe.moe_layers) if moe is not None and arch.expert_parameters else 0
    shared = bool(moe is not None and moe.shared_intermediate_size)
    mla = bool(arch.kv_lora_rank)
    attention = ATTENTION_GEMMS["mla" if mla else "gqa"]
    moe_gemms = ROUTER_GEMMS + (SHARED_EXPERT_GEMMS if shared else 0)
    gemms = attention + (moe_layers * moe_gemms + (layers - moe_layers) * DENSE_MLP_GEMMS) / layers
    act = (moe_layers * shared + layers - moe_layers) / layers
    kernels = LAYER_KERNELS + (MLA_KERNELS if mla else 0) + act * ACTIVATION_KERNELS
    return gemms, kernels
