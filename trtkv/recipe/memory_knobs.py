"""Which backend's engine reads each memory knob of the `triton:` section (vLLM's
gpu_memory_utilization, SGLang's mem_fraction_static, TensorRT-LLM's kv_cache_free_gpu_mem_fraction,
trtkv's kv_pool_gib_per_gpu), and the rule that refuses a knob set explicitly for a backend whose
engine ignores it."""

from __future__ import annotations

from trtkv.recipe.enums import Backend
from trtkv.recipe.schema import Recipe

# Which backend's engine reads each memory knob (its module under trtkv/engines turns it into the
# served command's flag)
MEMORY_KNOBS: dict[str, tuple[Backend, ...]] = {
    "gpu_memory_utilization": (Backend.VLLM,),
    "mem_fraction_static": (Backend.SGLANG,),
    "kv_cache_free_gpu_mem_fraction": (Backend.LLMAPI, Backend.TENSORRT),
    "kv_pool_gib_per_gpu": (Backend.VLLM, Backend.SGLANG, Backend.LLMAPI, Backend.TENSORRT),
}


def memory_knob_problems(r: Recipe) -> list[tuple[str, str]]:
    """A memory knob set explicitly for a backend whose engine ignores it (left unset, a knob is the
    engine's own default and never refused)."""
    out = []
    for knob, readers in MEMORY_KNOBS.items():
        if (
            knob in r.triton.model_fields_set
            and getattr(r.triton, knob) is not None
            and r.build.backend not in readers
        ):
            # its own: the first knob its engine reads (MEMORY_KNOBS lists the engines' own
            # fractions before the shared kv_pool_gib_per_gpu)
            own = next((k for k, who in MEMORY_KNOBS.items() if r.build.backend in who), None)
            hint = (
                f"its own knob is triton.{own}"
                if own
                else "the reference runtime holds max_batch_size sequences "
                "of max_seq_len and has no memory knob"
            )
            out.append(
                (
                    f"triton.{knob}",
                    f"{getattr(r.triton, knob)} is read only by "
                    f"{', '.join(b.value for b in readers)}; build.backend "
                    f"{r.build.backend.value} ignores it ({hint}): remove it",
                )
            )
    return out
