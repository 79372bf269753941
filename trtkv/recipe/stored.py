"""A pre-quantized checkpoint in the recipe (model.checkpoint_quant, recorded by `trtkv init` from
its config.json quantization_config): its weights are used as stored (quantization.weights none),
re-quantized only when a weights format is asked for and never into one as large or larger, and a
calibrated KV cache only where the engine reads KV scales beside those weights."""

from __future__ import annotations

from trtkv.recipe.backend_rules import NO_KV_METHOD
from trtkv.recipe.enums import KVCacheQuant, WeightQuant
from trtkv.recipe.schema import Recipe

# bits per weight of each stored format trtkv recognises (trtkv.checkpoints' StoredQuant.method and
# ModelOpt's quant_algo words, lower-cased); awq/gptq at their usual 4 bits, so an 8-bit one is
# never re-quantized to fp8 either. A format absent here is never re-quantized (its size unknown).
STORED_BITS: dict[str, float] = {
    "fp8": 8,
    "fp8_block": 8,
    "compressed-tensors": 8,  # the widest it writes (FP8 / INT8 W8A8); W4A16 is smaller still
    "int8": 8,
    "w8a8": 8,
    "mxfp4": 4,
    "nvfp4": 4,
    "int4_awq": 4,
    "w4a16": 4,
    "awq": 4,
    "gptq": 4,
}
# bits per weight of each quantization.weights format
WEIGHT_BITS: dict[WeightQuant, float] = {
    WeightQuant.FP8: 8,
    WeightQuant.INT8_SQ: 8,
    WeightQuant.INT4_AWQ: 4,
}


def stored_problems(r: Recipe) -> list[tuple[str, str]]:
    """A weights format asked for on a pre-quantized checkpoint that is not smaller than it, and a
    calibrated KV cache where the engine reads no KV scale beside those weights."""
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
    if why and r.kv_row.choice.checkpoint_algo is not None:
        out.append(
            (
                "quantization.kv_cache",
                f"{q.kv_cache.value} on a checkpoint stored as {stored} with build.backend "
                f"{r.build.backend.value}: {why}. Use kv_cache {KVCacheQuant.FP8_CAST.value} (that "
                f"FP8 cache at scale 1.0, said and priced as such; `trtkv probe --formats "
                f"fp8,fp8_cast` measures it), kv_cache none (16-bit), or another build.backend",
            )
        )
    return out
