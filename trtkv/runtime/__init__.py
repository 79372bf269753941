"""trtkv's reference runtime: the exported TensorRT-LLM checkpoint executed in PyTorch on the CPU.

It is a correctness reference, not TensorRT: it reads `rank0.safetensors` of the checkpoint that `trtllm-build`
would compile, dequantizes FP8 weights with their `weights_scaling_factor` (so the weight numerics are the
engine's), and decodes with trtkv's quantized KV cache using the checkpoint's per-layer `kv_cache_scaling_factor`
(TensorRT-LLM <= 1.2 semantics: one scale per layer shared by K and V). Computation is float32.

Activations are NOT quantized: the checkpoint's `activation_scaling_factor` tensors (FP8 GEMM inputs on a GPU) are
ignored, every GEMM runs in float32 on the dequantized weights. So the reference reproduces the engine's weight and
KV-cache numerics, not its FP8 activation rounding; differences that come from the latter will not show here.

    rt = ReferenceRuntime.load(Path("engines/smollm2_fp8kv/engine"))
    ids = rt.generate(rt.tokenizer("Q: capital of France?\\nA:")["input_ids"], max_tokens=8)
"""


from trtkv.runtime.batch import Batcher, SequenceState, make_sequence
from trtkv.runtime.checkpoint import (
    GLOBAL_NAMES,
    KV_FORMATS,
    LAYER_NAMES,
    REQUIRED_ARCH,
    RUNTIME_JSON,
    TRTLLM_DEFAULTS,
    build_model,
    checkpoint_architecture,
    hf_to_trtllm_state_dict,
    kv_scaling_factors,
    llama_config,
    trtllm_to_hf_state_dict,
)
from trtkv.runtime.engine import ReferenceRuntime
from trtkv.runtime.errors import RequestError
from trtkv.runtime.quiz import quiz_agreement, quiz_answers
from trtkv.runtime.sampling import LogitControls, pick_token

__all__ = ["GLOBAL_NAMES", "KV_FORMATS", "LAYER_NAMES", "REQUIRED_ARCH", "RUNTIME_JSON", "TRTLLM_DEFAULTS",
           "Batcher", "LogitControls", "ReferenceRuntime", "RequestError", "SequenceState", "build_model",
           "checkpoint_architecture", "make_sequence",
           "hf_to_trtllm_state_dict", "kv_scaling_factors", "llama_config", "pick_token", "quiz_agreement",
           "quiz_answers", "trtllm_to_hf_state_dict"]
