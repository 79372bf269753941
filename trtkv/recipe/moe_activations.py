"""build.moe_activations: the activations MXFP4 experts (gpt-oss's) run with on the recipe's
engine and GPU, either the engine's own pick (auto) or the recipe's, and what each engine allows:

- TensorRT-LLM (tensorrt, llmapi): MXFP8 on Blackwell, BF16 elsewhere, no switch (its
  examples/models/core/gpt_oss/README.md MoE support matrix: Hopper bf16, Blackwell mxfp8).
- vLLM 0.32.0: BF16 (fused_moe/oracle/mxfp4.py `_get_priority_backends_for_gpt_oss` lists each
  BF16 kernel before its MXFP8 twin); MXFP8 on request (`--quantization-config` moe.activation,
  config/quantization.py QuantizationConfigArgs) where its FlashInfer MXFP8 kernels run, compute
  capability 10.0+ (experts/trtllm_mxfp4_moe.py, flashinfer_cutlass_moe.py); elsewhere vLLM falls
  back to BF16 with a warning (`_warn_on_bf16_fallback`), so trtkv refuses the request.
- SGLang 0.5.23: on SM10x its gpt-oss override picks the flashinfer_mxfp4 runner
  (arg_groups/model_overrides/gpt_oss.py), MXFP8 activations unless
  `--flashinfer-mxfp4-moe-precision bf16` (layers/quantization/mxfp4_flashinfer_trtllm_moe.py); on
  SM12x always MXFP8 (mxfp4_flashinfer_cutlass_moe.py sets it by the GPU); below Blackwell BF16
  (triton_kernel).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from trtkv.platform.gpu_capabilities import gpus_where
from trtkv.platform.hardware import GPU, GPU_SPECS
from trtkv.recipe.backend_rules import SPEED_ENGINE
from trtkv.recipe.schema import Recipe

MoEActivation = Literal["bf16", "mxfp8"]
FIELD = "build.moe_activations"
# the stored expert format the field applies to (StoredQuant.stored_format's word)
MXFP4 = "mxfp4"


@dataclass(frozen=True)
class EngineRule:
    """What one engine runs MXFP4 experts with on an FP4 GPU (compute capability 10+) by itself, and
    which activations it can be asked for there, by compute capability major."""

    label: str
    default_fp4: MoEActivation
    allowed_fp4: dict[int, tuple[MoEActivation, ...]]
    source: str


# by aiconfigurator's engine name (trtkv.recipe.SPEED_ENGINE); below Blackwell every engine runs
# BF16 activations and takes no other
ENGINES = {
    "trtllm": EngineRule(
        "TensorRT-LLM",
        "mxfp8",
        {10: ("mxfp8",), 12: ("mxfp8",)},
        "its examples/models/core/gpt_oss/README.md MoE support matrix: Blackwell mxfp8",
    ),
    "vllm": EngineRule(
        "vLLM",
        "bf16",
        {10: ("bf16", "mxfp8"), 12: ("bf16", "mxfp8")},
        "vLLM 0.32.0 prefers its BF16 MXFP4 kernels for gpt-oss (fused_moe/oracle/mxfp4.py)",
    ),
    "sglang": EngineRule(
        "SGLang",
        "mxfp8",
        {10: ("mxfp8", "bf16"), 12: ("mxfp8",)},
        "SGLang 0.5.23's flashinfer_mxfp4 runner quantizes the routed input to MXFP8 on "
        "Blackwell unless --flashinfer-mxfp4-moe-precision bf16 (SM10x only)",
    ),
}


def _rule(recipe: Recipe) -> tuple[EngineRule | None, int]:
    """The recipe's engine rule (None: no GPU engine) and its GPU's compute capability major (0 on
    the CPU)."""
    hw = recipe.hardware
    major = 0 if hw.gpu is GPU.CPU else GPU_SPECS[hw.gpu].sm[0]
    return ENGINES.get(SPEED_ENGINE.get(recipe.build.backend, "")), major


def allowed_moe_activations(recipe: Recipe) -> tuple[MoEActivation, ...]:
    """The activations the recipe's engine runs MXFP4 experts with on its GPU, its own first."""
    rule, major = _rule(recipe)
    if rule is None or major not in rule.allowed_fp4:
        return ("bf16",)
    return rule.allowed_fp4[major]


def resolved_moe_activations(recipe: Recipe) -> MoEActivation:
    """The activations MXFP4 experts run with: the recipe's choice, else the engine's default."""
    chosen = recipe.build.moe_activations
    if chosen != "auto":
        return chosen
    return allowed_moe_activations(recipe)[0]


def moe_activations_text(recipe: Recipe) -> str:
    """One clause for the plan: what the experts run with and who chose it."""
    act = resolved_moe_activations(recipe)
    rule, _ = _rule(recipe)
    label = rule.label if rule is not None else recipe.build.backend.value
    if recipe.build.moe_activations != "auto":
        return f"MXFP4 experts with {act.upper()} activations ({FIELD} {act}, on {label})"
    why = f"; {rule.source}" if rule is not None else ""
    return f"MXFP4 experts with {act.upper()} activations ({label}'s own choice on this GPU{why})"


def moe_activation_problems(recipe: Recipe) -> list[tuple[str, str]]:
    """An activation the recipe's engine does not run MXFP4 experts with on its GPU (where the
    engine would fall back, or has no switch)."""
    chosen = recipe.build.moe_activations
    if chosen == "auto":
        return []
    ok = allowed_moe_activations(recipe)
    if chosen in ok:
        return []
    rule, _ = _rule(recipe)
    label = rule.label if rule is not None else recipe.build.backend.value
    gpu = recipe.hardware.gpu.value
    if chosen == "mxfp8" and len(ok) == 1 and ok[0] == "bf16":
        why = (
            f"MXFP8 activations need FP4 tensor cores, compute capability 10.0+ "
            f"({', '.join(gpus_where('fp4'))}); on {gpu} {label} runs BF16 activations"
        )
    else:
        why = f"{label} on {gpu} runs MXFP4 experts with {' or '.join(ok)} activations only" + (
            f" ({rule.source})" if rule is not None else ""
        )
    _, major = _rule(recipe)
    others = [
        r.label
        for r in ENGINES.values()
        if r is not rule and chosen in r.allowed_fp4.get(major, ("bf16",))
    ]
    where = f"; or a build.backend whose engine runs {chosen} here: {' and '.join(others)}"
    where = where if others else ""
    return [(FIELD, f"{chosen}: {why}. Allowed here: auto, {', '.join(ok)}{where}")]
