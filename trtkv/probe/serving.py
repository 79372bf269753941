"""Which engines can serve a probed KV configuration: the recipe's own rules (pydantic schema,
cross-field rules and every backend's `problems`) asked with that KV format, those skipped layers,
each GPU engine backend (every backend but trtkv's CPU runtime) and each GPU, so the answer is the
one `trtkv build` would give, not a second list to keep in step."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from trtkv.kvcache.engines import load_table
from trtkv.platform.gpu_capabilities import ONE_PER_SM
from trtkv.platform.hardware import GPU
from trtkv.recipe import Backend, KVCacheQuant, Recipe


def kv_cache_of_format(fmt: str) -> KVCacheQuant | None:
    """The recipe's quantization.kv_cache that stores probe format `fmt`: its KV-format registry
    row's recipe choice (fp8_scale1: fp8_cast), the unquantized choice for a 16-bit format; None
    for the probe's formats no engine stores (per-token INT8, INT4 groups, KIVI, ...)."""
    table = load_table()
    row = table.for_probe(fmt)
    if row is not None and row.recipe is None and row.storage and row.storage.bits >= 16:
        row = table.for_checkpoint_algo(None)
    return KVCacheQuant(row.recipe.name) if row is not None and row.recipe else None


def serving(recipe: Recipe, fmt: str, keep: list[int] | None = None) -> dict[str, Any]:
    """{"engines": {backend: [GPUs it validates on]}, "why_not": {backend: first refusal}} for `fmt`
    with the layers `keep` in the model dtype, on the recipe's GPU (when the recipe runs on the CPU:
    one GPU per compute capability, gpu_capabilities.ONE_PER_SM, which stands for every GPU of the
    table with that capability)."""
    from trtkv.backends import BACKENDS

    engine_backends = [b for b, obj in BACKENDS.items() if obj.gpu_engine]
    kv = kv_cache_of_format(fmt)
    if kv is None:
        reason = (
            f"{fmt} is not a KV cache dtype of TensorRT-LLM or vLLM (trtkv's probe measures "
            "it for comparison)"
        )
        return {"engines": {}, "why_not": {b.value: reason for b in engine_backends}, "gpus": []}
    gpus = [recipe.hardware.gpu] if recipe.hardware.gpu is not GPU.CPU else list(ONE_PER_SM)
    engines: dict[str, list[str]] = {}
    why_not: dict[str, str] = {}
    for backend in engine_backends:
        refusals: dict[str, list[str]] = {}
        for gpu in gpus:
            problem = _problem(
                recipe, kv, sorted(keep or []) if kv is not KVCacheQuant.NONE else [], backend, gpu
            )
            if problem is None:
                engines.setdefault(backend.value, []).append(gpu.value)
            else:
                refusals.setdefault(problem, []).append(gpu.value)
        # the refusal most GPUs share: the one about the KV choice
        if backend.value not in engines and refusals:
            problem, on = max(refusals.items(), key=lambda item: len(item[1]))
            why_not[backend.value] = f"{problem} ({', '.join(on)})"
    return {"engines": engines, "why_not": why_not, "gpus": [g.value for g in gpus]}


def _problem(
    recipe: Recipe, kv: KVCacheQuant, keep: list[int], backend: Backend, gpu: GPU
) -> str | None:
    from trtkv.recipe.rules import cross_field_problems

    data = recipe.model_dump(mode="json")
    data["quantization"].update(kv_cache=kv.value, kv_skip_layers=keep)
    data["build"]["backend"] = backend.value
    data["hardware"]["gpu"] = gpu.value
    try:
        variant = Recipe.model_validate(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        return f"{'.'.join(map(str, err['loc']))}: {err['msg']}"
    problems = cross_field_problems(variant)
    return f"{problems[0][0]}: {problems[0][1]}" if problems else None


def usable_gpus(infos: list[dict[str, Any]]) -> list[str]:
    """The GPUs some engine accepts for some configuration (the recipe's model and weights run
    there), in order."""
    seen = {g for info in infos for gpus in (info.get("engines") or {}).values() for g in gpus}
    order: list[str] = next((info["gpus"] for info in infos if info.get("gpus")), [])
    return [g for g in order if g in seen]


def served_by(info: dict[str, Any], usable: list[str] | None = None) -> str:
    """One line: 'tensorrt, vllm' (on every usable GPU), 'tensorrt (H100-80GB, L40S)', or 'no
    engine'."""
    engines = info.get("engines") or {}
    if not engines:
        return "no engine"
    every = usable if usable is not None else info.get("gpus") or []
    return ", ".join(
        b if gpus == every else f"{b} ({', '.join(gpus)})" for b, gpus in engines.items()
    )
