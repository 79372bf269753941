"""A pre-quantized checkpoint in the recipe (model.checkpoint_quant, recorded by `trtkv init` from
its config.json quantization_config): its weights are used as stored (quantization.weights none),
re-quantized only when a weights format is asked for and never into one as large or larger, and a
calibrated KV cache only where the engine reads KV scales beside those weights; where the engine
runs an FP8 KV cache at scale 1.0 whatever scales the checkpoint holds (engine_unit_scale), the plan
says so and prices the cache as fp8_cast; kv_cache none is refused where the engine would run the
KV format the checkpoint declares instead (declared_kv_problems)."""

from __future__ import annotations

import re

from trtkv.kvcache.engines import load_table
from trtkv.recipe.backend_rules import BACKEND_ROWS, NO_KV_METHOD
from trtkv.recipe.engine_formats import TABLE_ENGINE
from trtkv.recipe.enums import Backend, KVCacheQuant, WeightQuant
from trtkv.recipe.schema import Recipe

# bits per weight of each stored format trtkv recognises (every word StoredQuant.stored_format
# gives: the method of an fp8 / mxfp4 / awq / gptq config, the weight format of a ModelOpt or
# compressed-tensors one, e.g. int4 for compressed-tensors W4A16; and ModelOpt's quant_algo words,
# lower-cased); awq/gptq at their usual 4 bits, so an 8-bit one is never re-quantized to fp8 either.
# A format absent here is never re-quantized (its size unknown).
STORED_BITS: dict[str, float] = {
    "fp8": 8,
    "fp8_block": 8,
    "mxfp8": 8,
    "compressed-tensors": 8,  # the widest it writes (FP8 / INT8 W8A8); W4A16 is smaller still
    "int8": 8,
    "w8a8": 8,
    "int8_awq": 8,
    "int8_gptq": 8,
    "mxfp4": 4,
    "nvfp4": 4,
    "int4": 4,
    "int4_awq": 4,
    "int4_gptq": 4,
    "w4a16": 4,
    "awq": 4,
    "gptq": 4,
}
# the stored weight formats `trtkv calibrate` dequantizes (ModelOpt's own qtensors) to calibrate a
# KV cache on them as the engine runs them (trtkv.calibrate.dequantize): where vLLM reads the scales
# beside such weights, it is the engine to offer when another one reads none
KV_CALIBRATED_WEIGHTS = ("fp8", "fp8_block", "nvfp4")
# bits per weight of each quantization.weights format
WEIGHT_BITS: dict[WeightQuant, float] = {
    WeightQuant.FP8: 8,
    WeightQuant.INT8_SQ: 8,
    WeightQuant.INT4_AWQ: 4,
}


def stored_problems(r: Recipe) -> list[tuple[str, str]]:
    """A weights format asked for on a pre-quantized checkpoint that is not smaller than it, and a
    calibrated KV cache where the engine reads no KV scale beside those weights: a stored format
    whose engine config gives attention no KV method (NO_KV_METHOD), or an engine that runs every
    FP8 KV cache at scale 1.0 (engine_unit_scale: TensorRT-LLM's PyTorch backend, llmapi), where
    calibrate would write scales nothing reads; `trtkv init` then moves its default to fp8_cast
    (trtkv.recipe.settle)."""
    stored, q = r.model.checkpoint_quant, r.quantization
    if not stored:
        return []
    out: list[tuple[str, str]] = []
    if q.weights is not WeightQuant.NONE:
        have, want = STORED_BITS.get(stored.lower()), WEIGHT_BITS.get(q.weights)
        if have is None or want is None or want >= have:
            size = f"{have:g}-bit" if have else "of unknown size"
            out.append(
                (
                    "quantization.weights",
                    f"{q.weights.value} on a checkpoint stored as {stored} ({size}, "
                    f"model.checkpoint_quant): trtkv never quantizes stored weights again into a "
                    f"format as large or larger. Use quantization.weights none (the weights as "
                    f"stored; `trtkv calibrate` then calibrates the KV cache only)",
                )
            )
    why = NO_KV_METHOD.get((r.build.backend, stored.lower()))
    if why is None and q.kv_cache is KVCacheQuant.FP8:
        why = engine_unit_scale(r)  # the engine reads no FP8 KV scale at all (TensorRT-LLM's)
    other = (
        f"build.backend {Backend.VLLM.value} (vLLM reads calibrated k/v scales beside stored "
        f"{stored} weights; `trtkv calibrate` writes them there)"
        if stored.lower() in KV_CALIBRATED_WEIGHTS
        else "another build.backend"
    )
    if why and r.kv_row.choice.checkpoint_algo is not None:
        out.append(
            (
                "quantization.kv_cache",
                f"{q.kv_cache.value} on a checkpoint stored as {stored} with build.backend "
                f"{r.build.backend.value}: {why}. Use kv_cache {KVCacheQuant.FP8_CAST.value} (that "
                f"FP8 cache at scale 1.0, said and priced as such, the weights served as stored "
                f"with nothing to calibrate; `trtkv probe --formats fp8,fp8_cast` measures it), "
                f"kv_cache none (16-bit, where the checkpoint declares no KV format), or {other}",
            )
        )
    return out


def declared_kv_problems(r: Recipe, declared: str | None, where: str) -> list[tuple[str, str]]:
    """kv_cache none on a checkpoint (at `where`) that declares a KV-cache format, where the engine
    runs that format under the setting none is served with (BackendRow.kv_from_checkpoint): the
    recipe would plan a 16-bit cache the server does not hold, so it is refused with the kv_cache
    that says what runs. `declared`: trtkv.checkpoints.declared_kv_algo."""
    follows = BACKEND_ROWS[r.build.backend].kv_from_checkpoint
    if declared is None or follows is None or r.quantization.kv_cache is not KVCacheQuant.NONE:
        return []
    runs = follows.runs.get(declared.split(" ")[0].lower())
    if runs is None or declared.lower() in follows.ignored:
        return []
    return [
        (
            "quantization.kv_cache",
            f"none on build.backend {r.build.backend.value}, but the checkpoint {where} declares "
            f"a KV cache of {declared}: {follows.why}, so the server would hold that, not the "
            f"16-bit cache kv_cache none plans. Use kv_cache {runs.value} (what it runs, planned "
            "as such), or remove the checkpoint's KV declaration (hf_quant_config.json "
            "kv_cache_quant_algo, config.json quantization_config kv_cache_scheme) for a 16-bit "
            "cache",
        )
    ]


def engine_unit_scale(r: Recipe) -> str | None:
    """Why the recipe's engine will run its FP8 KV cache at scale 1.0 (what fp8_cast is) whatever
    k/v scales the checkpoint holds, naming where its source says so; None where the engine reads
    them or the cache is not FP8. From NO_KV_METHOD (a stored format whose engine config gives
    attention no KV method: vLLM's MXFP4, for fp8 and fp8_cast alike) and trtkv/data/kv_formats.json
    (the fp8 row's entry of the backend's engine says "not read": TensorRT-LLM's PyTorch backend,
    for a calibrated fp8 recipe)."""
    kv = r.quantization.kv_cache
    if kv not in (KVCacheQuant.FP8, KVCacheQuant.FP8_CAST):
        return None
    why = NO_KV_METHOD.get((r.build.backend, (r.model.checkpoint_quant or "").lower()))
    if why or kv is KVCacheQuant.FP8_CAST:
        return why
    engine, prefix = TABLE_ENGINE.get(r.build.backend, ("", ""))
    for e in load_table().engine_rows(kv.value, engine, prefix) if engine else []:
        if e.value == "fp8" and e.checkpoint_scales.startswith("not read"):
            files = ", ".join(dict.fromkeys(re.findall(r"[\w/]+\.py", e.source_file)))
            return (
                f"{engine} {e.version} (`{e.config} {e.value}`): checkpoint k/v scales "
                f"{e.checkpoint_scales} ({files} at {e.source_at.split(' ')[0]})"
            )
    return None
