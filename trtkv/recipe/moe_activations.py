"""build.moe_activations: the activations MXFP4 experts (gpt-oss's) run with on the recipe's
engine and GPU, the engine's own pick (auto) or the recipe's, refused where the engine would not
run it (vLLM falls back to BF16 with a warning below 10.0: fused_moe/oracle/mxfp4.py
`_warn_on_bf16_fallback`; TensorRT-LLM has no switch; SGLang's SM12x path is MXFP8 whatever it is
told). What each engine allows is its backend row's column (trtkv.recipe.engine_columns
Mxfp4Activations); the engines' arguments are in trtkv.backends (vLLM `--quantization-config`
moe.activation, SGLang `--flashinfer-mxfp4-moe-precision bf16`)."""

from __future__ import annotations

from trtkv.platform.gpu_capabilities import gpus_where
from trtkv.platform.hardware import GPU, GPU_SPECS
from trtkv.recipe.backend_rules import BACKEND_ROWS, SPEED_ENGINES
from trtkv.recipe.engine_columns import MoEActivation, SpeedEngine
from trtkv.recipe.schema import Recipe

FIELD = "build.moe_activations"


def _engine(recipe: Recipe) -> tuple[SpeedEngine | None, int]:
    """The recipe's GPU engine (None: the CPU reference runtime) and its GPU's compute capability
    major (0 on the CPU)."""
    hw = recipe.hardware
    major = 0 if hw.gpu is GPU.CPU else GPU_SPECS[hw.gpu].sm[0]
    return BACKEND_ROWS[recipe.build.backend].speed_engine, major


def _allowed(engine: SpeedEngine | None, major: int) -> tuple[MoEActivation, ...]:
    """What `engine` runs MXFP4 experts with on a GPU of compute capability `major`, its own first
    (BF16 alone below Blackwell and without an engine rule)."""
    rule = engine.mxfp4_moe if engine is not None else None
    return rule.allowed[major] if rule is not None and major in rule.allowed else ("bf16",)


def moe_activation_choices(recipe: Recipe) -> tuple[MoEActivation, ...]:
    """What the recipe's engine runs MXFP4 experts with on its GPU, its own pick first."""
    return _allowed(*_engine(recipe))


def resolved_moe_activations(recipe: Recipe) -> MoEActivation:
    """The activations MXFP4 experts run with: the recipe's choice, else the engine's own."""
    chosen = recipe.build.moe_activations
    return moe_activation_choices(recipe)[0] if chosen == "auto" else chosen


def moe_activations_text(recipe: Recipe) -> str:
    """One clause for the plan: what the experts run with and who chose it."""
    act = resolved_moe_activations(recipe)
    engine, _ = _engine(recipe)
    label = engine.label if engine is not None else recipe.build.backend.value
    if recipe.build.moe_activations != "auto":
        return f"MXFP4 experts with {act.upper()} activations ({FIELD} {act}, on {label})"
    rule = engine.mxfp4_moe if engine is not None else None
    why = f"; {rule.source}" if rule is not None else ""
    return f"MXFP4 experts with {act.upper()} activations ({label}'s own choice on this GPU{why})"


def moe_activation_problems(recipe: Recipe) -> list[tuple[str, str]]:
    """An activation the recipe's engine does not run MXFP4 experts with on its GPU (where the
    engine would fall back, or has no switch)."""
    chosen = recipe.build.moe_activations
    engine, major = _engine(recipe)
    ok = _allowed(engine, major)
    if chosen == "auto" or chosen in ok:
        return []
    label = engine.label if engine is not None else recipe.build.backend.value
    gpu = recipe.hardware.gpu.value
    if ok == ("bf16",):
        why = (
            f"MXFP8 activations need FP4 tensor cores, compute capability 10.0+ "
            f"({', '.join(gpus_where('fp4'))}); on {gpu} {label} runs BF16 activations"
        )
    else:
        rule = engine.mxfp4_moe if engine is not None else None
        why = f"{label} on {gpu} runs MXFP4 experts with {' or '.join(ok)} activations only" + (
            f" ({rule.source})" if rule is not None else ""
        )
    others = [
        e.label for e in SPEED_ENGINES.values() if e is not engine and chosen in _allowed(e, major)
    ]
    where = f"; or a build.backend whose engine runs {chosen} here: {' and '.join(others)}"
    where = where if others else ""
    return [(FIELD, f"{chosen}: {why}. Allowed here: auto, {', '.join(ok)}{where}")]
