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

Not every weight is split by tensor parallelism: MLA's down-projections (q_a_proj and
kv_a_proj_with_mqa, one fused GEMM whose outputs are the latents every head reads) and a MoE
layer's router are whole on every TP rank in the three engines: SGLang 0.4.8
(sglang/srt/models/deepseek_v2.py: `fused_qkv_a_proj_with_mqa = ReplicatedLinear(...)`, `MoEGate`'s
plain weight), vLLM 0.32.0 (models/deepseek_v2.py: `DeepSeekV2FusedQkvAProjLinear(...,
disable_tp=True)`, `GateLinear(ReplicatedLinear)`), TensorRT-LLM (1.x main's
_torch/modules/attention.py MLA: `kv_a_proj_with_mqa = Linear(hidden_size, q_lora_rank +
kv_lora_rank + qk_rope_head_dim, ...)` without the `mapping` and `TensorParallelMode.COLUMN` its
q_b_proj gets). A decode step reads them whole on each GPU; a prefill computes them whole.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from trtkv.checkpoints import read_model_facts
from trtkv.engines.sizing import model_config_path
from trtkv.plan.moe_step import Shape

if TYPE_CHECKING:
    from trtkv.plan.model import Architecture
    from trtkv.recipe import Recipe

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


def replicated_parameters(arch: Architecture, q_lora_rank: int | None) -> float:
    """Parameters every tensor-parallel rank holds whole (module docstring): MLA's down-projections
    (without a q latent, q_proj is column-parallel and only kv_a_proj_with_mqa is whole) and the
    MoE layers' routers."""
    mla = 0.0
    if arch.kv_lora_rank:
        latents = (q_lora_rank or 0) + arch.kv_lora_rank + (arch.qk_rope_head_dim or 0)
        mla = float(arch.num_layers * arch.hidden_size * latents)
    moe = arch.moe
    routers = 0.0
    if moe is not None and arch.expert_parameters:
        routers = float(len(moe.moe_layers) * arch.hidden_size * moe.num_experts)
    return mla + routers


def with_replicated(m: Shape, arch: Architecture, recipe: Recipe) -> Shape:
    """`m` with the weights every TP rank holds whole (replicated_parameters) counted whole on each
    GPU, at the non-expert weights' mean bytes per parameter."""
    path = model_config_path(recipe)
    q_lora_rank = read_model_facts(path).q_lora_rank if path is not None else None
    whole = replicated_parameters(arch, q_lora_rank) * (1 - 1 / m.tp)
    if not whole or not m.gemm_params:
        return m
    per_param = m.weight_bytes / m.gemm_params
    return replace(
        m, gemm_params=m.gemm_params + whole, weight_bytes=m.weight_bytes + whole * per_param
    )
