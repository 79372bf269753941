"""trtkv's reference runtime: the exported TensorRT-LLM checkpoint executed in PyTorch on the CPU.

It is a correctness reference, not TensorRT: it reads `rank0.safetensors` of the checkpoint that
`trtllm-build` would compile, dequantizes FP8 weights with their `weights_scaling_factor` (so the
weight numerics are the engine's), and decodes with trtkv's quantized KV cache using the
checkpoint's per-layer `kv_cache_scaling_factor` (TensorRT-LLM <= 1.2 semantics: one scale per layer
shared by K and V). Computation is float32.

Activations are NOT quantized: the checkpoint's `activation_scaling_factor` tensors (FP8 GEMM inputs
on a GPU) are ignored, every GEMM runs in float32 on the dequantized weights. So the reference
reproduces the engine's weight and KV-cache numerics, not its FP8 activation rounding; differences
that come from the latter will not show here.

    rt = ReferenceRuntime.load(Path("engines/smollm2_fp8kv/engine"))
    ids = rt.generate(rt.tokenizer("Q: capital of France?\\nA:")["input_ids"], max_tokens=8)
"""

from typing import TYPE_CHECKING

from trtkv.core.lazy import attach
from trtkv.runtime.batch import Batcher, make_sequence
from trtkv.runtime.checkpoint import build_model, llama_config, read_json, trtllm_to_hf_state_dict
from trtkv.runtime.engine import ReferenceRuntime, eos_ids
from trtkv.runtime.sampling import LogitControls

if TYPE_CHECKING:
    from trtkv.runtime.llm import LLM
    from trtkv.runtime.llm_request import SamplingParams

# the LLM API and the quiz are imported on first use
__getattr__, __dir__ = attach(
    __name__, submodules=["hf_checkpoint", "quiz_patterns"], stub=__file__
)

__all__ = [
    "Batcher",
    "build_model",
    "eos_ids",
    "hf_checkpoint",
    "llama_config",
    "LLM",
    "LogitControls",
    "make_sequence",
    "quiz_patterns",
    "read_json",
    "ReferenceRuntime",
    "SamplingParams",
    "trtllm_to_hf_state_dict",
]
