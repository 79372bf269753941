"""What each served engine is told about its KV pool: the engine's own memory flag and value, and
the cap or pin from triton.kv_pool_gib_per_gpu. One function per engine, which each backend names as
its `memory.knobs` (trtkv.backends.seam.MemoryRule): the planner (trtkv.plan.engine_pool), the
backends' serve commands, deploy and repo all read it, so a served engine is configured with exactly
what the plan used.

Defaults at trtkv's pinned releases when the recipe leaves a knob unset:
  vLLM 0.32.0      --gpu-memory-utilization 0.92 (vllm/config/cache.py
  CacheConfig.gpu_memory_utilization) SGLang 0.5.23    --mem-fraction-static computed
  (python/sglang/srt/arg_groups/memory_hook.py) TensorRT-LLM     free_gpu_memory_fraction 0.9
  (KvCacheConfig; the C++ kDefaultGpuMemFraction)
On the CPU, vLLM's pool is pinned to max_batch_size sequences of max_seq_len unless the recipe sets
a knob (--gpu-memory-utilization there is a share of the host's memory).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trtkv.checkpoints.hf_config import read_model_facts
from trtkv.core.readback import MAX_POOL_BYTES, MAX_POOL_TOKENS, real, whole
from trtkv.platform.hardware import GPU, GPU_SPECS
from trtkv.recipe import Recipe
from trtkv.recipe.attention import (
    VLLM_BLOCK_CPU,
    VLLM_BLOCK_GPU,
    Accounting,
    AttentionKind,
    KVShape,
    LayerAttention,
    layer_formats,
    parse_layers,
)
from trtkv.recipe.backend_rules import KV_ACCOUNTING
from trtkv.recipe.sequence import sequence_kv_bytes
from trtkv.recipe.state import STATE_DTYPE_BYTES, StateSpec, state_dtypes, state_from_dict

GIB = 1024**3
VLLM_VERSION = "0.32.0"
SGLANG_VERSION = "0.5.23"
VLLM_DEFAULT_UTIL = 0.92
TRTLLM_DEFAULT_FRACTION = 0.9


@dataclass(frozen=True)
class EngineKnobs:
    """The memory flags a served engine gets: its own knob (always passed, the default resolved) and
    the cap/pin."""

    flag: str | None  # None: the backend has no memory knob (the reference runtime)
    value: float | None
    is_default: bool
    cap_flag: str | None = None
    # bytes (vLLM --kv-cache-memory-bytes) or tokens (SGLang, TensorRT-LLM)
    cap_value: int | None = None

    @property
    def pins(self) -> bool:
        """The engine takes the cap as the pool's size (vLLM) rather than as an upper bound."""
        return self.cap_flag == "--kv-cache-memory-bytes"


def model_config_path(recipe: Recipe) -> Path | None:
    """config.json of the recipe's model when it is on this machine (local folder or converted
    package)."""
    source = recipe.model.source
    if source.startswith("packaged:"):
        from trtkv.checkpoints.models import packaged_model_dir  # light import: paths only

        folder = packaged_model_dir(source.split(":", 1)[1])
    else:
        folder = Path(source).expanduser()
        if not folder.is_absolute() and recipe.path is not None:
            folder = recipe.path.parent / folder
    cfg = folder / "config.json"
    return cfg if cfg.is_file() else None


def recipe_kv_layout(recipe: Recipe) -> tuple[tuple[LayerAttention, ...], KVShape] | None:
    """The recipe's layers and per-token KV shape (with the fixed state of its linear / mamba
    layers, in the dtypes the recipe's engine gives them: trtkv.recipe.state.state_dtypes): the
    model config when present (as the planner reads it), else the recipe's model fields; None when
    neither says."""
    cfg = model_config_path(recipe)
    m = recipe.model
    if cfg is not None:
        f = read_model_facts(cfg)
        latent = (f.kv_lora_rank + (f.qk_rope_head_dim or 0)) if f.kv_lora_rank else None
        shape = KVShape(f.num_kv_heads, f.head_dim, mla_latent=latent, sparse_mla=f.sparse_mla)
        return f.layers, _with_state(
            recipe, f.layers, shape, f.state, f.model_type, f.config_ssm_dtype
        )
    if None in (m.num_layers, m.num_kv_heads, m.head_dim):
        return None
    layers = parse_layers(m.attention_layers) if m.attention_layers else ()
    if len(layers) != m.num_layers:
        layers = (LayerAttention(AttentionKind.FULL),) * int(m.num_layers or 0)
    latent = (m.kv_lora_rank + (m.qk_rope_head_dim or 0)) if m.kv_lora_rank else None
    shape = KVShape(int(m.num_kv_heads or 0), int(m.head_dim or 0), mla_latent=latent)
    spec = state_from_dict(m.state_layers) if m.state_layers else None
    return layers, _with_state(recipe, layers, shape, spec, m.architecture or "", None)


def _with_state(
    recipe: Recipe,
    layers: tuple[LayerAttention, ...],
    shape: KVShape,
    spec: StateSpec | None,
    model_type: str,
    config_ssm: str | None,
) -> KVShape:
    """`shape` with the state layers' fixed state in the dtypes the recipe's engine resolves (vLLM's
    on vLLM)."""
    kind = next((x.kind for x in layers if x.is_state), None)
    if kind is None or spec is None:
        return shape
    vllm = KV_ACCOUNTING[recipe.build.backend] is Accounting.VLLM  # vLLM's defaults for `auto`
    conv, ssm, _why = state_dtypes(
        recipe.model.dtype.value,
        recipe.build.mamba_cache_dtype,
        recipe.build.mamba_ssm_cache_dtype,
        spec.kind,
        model_type,
        config_ssm,
        vllm,
        recipe.hardware.gpu is GPU.CPU,
    )
    return replace(
        shape,
        states=((kind, spec),),
        state_bytes=(float(STATE_DTYPE_BYTES[conv]), float(STATE_DTYPE_BYTES[ssm])),
    )


def kv_bytes_per_token_per_gpu(recipe: Recipe) -> float | None:
    """Bytes one token holds on the fullest GPU with every layer holding it (the recipe's KV
    format)."""
    layout = recipe_kv_layout(recipe)
    if layout is None:
        return None
    layers, shape = layout
    fmts = layer_formats(
        layers, recipe.kv_format, tuple(recipe.quantization.kv_skip_layers), recipe.kv_skip_format
    )
    return sequence_kv_bytes(layers, shape, fmts, 1, recipe.build.tp_size, recipe.build.pp_size)


def cpu_pin_bytes(recipe: Recipe) -> int:
    """vLLM CPU's default pool: max_batch_size sequences of max_seq_len as vLLM allocates them (CPU
    blocks of 128, sliding layers at window - 1 + max_num_batched_tokens, hybrid groups padded),
    whole GiB, at least 1 GiB."""
    layout = recipe_kv_layout(recipe)
    if layout is None:
        return GIB
    layers, shape = layout
    b = recipe.build
    fmts = layer_formats(
        layers, recipe.kv_format, tuple(recipe.quantization.kv_skip_layers), recipe.kv_skip_format
    )
    seq = sequence_kv_bytes(
        layers,
        shape,
        fmts,
        b.max_seq_len,
        accounting=Accounting.VLLM,
        batched_tokens=b.max_num_tokens,
        block=VLLM_BLOCK_CPU,
    )
    return max(1, math.ceil(seq * b.max_batch_size / GIB)) * GIB


def vllm_block(recipe: Recipe) -> int:
    return VLLM_BLOCK_CPU if recipe.hardware.gpu is GPU.CPU else VLLM_BLOCK_GPU


def gpu_memory_mib(recipe: Recipe) -> float:
    """The GPU's memory in MiB as the recipe gives it (hardware.memory_gib, else the GPU table)."""
    spec = GPU_SPECS.get(recipe.hardware.gpu)
    return (recipe.hardware.memory_gib or (spec.memory_gib if spec else 0.0)) * 1024


def sglang_prefill_graph_sizes(max_bs: int) -> list[int]:
    """SGLang's prefill CUDA-graph token buckets (arg_groups/cuda_graph_hook.py
    generate_prefill_cuda_graph_batch_sizes, sglang 0.5.23)."""
    sizes = [
        *range(4, 33, 4),
        *range(48, 257, 16),
        *range(288, 513, 32),
        *range(576, 1025, 64),
        *range(1280, 4097, 256),
        *range(4608, max_bs + 1, 512),
    ]
    return [s for s in sizes if s <= max_bs]


def sglang_decode_graph_max_bs(gpu_mem_mib: float, tp: int) -> int:
    """SGLang 0.5.23's default decode CUDA-graph max batch size by GPU memory (memory_hook.py)."""
    if gpu_mem_mib < 20 * 1024:
        return 8
    if gpu_mem_mib < 35 * 1024:
        return 48 if tp < 4 else 160
    if gpu_mem_mib < 60 * 1024:
        return 32 if tp < 4 else 160
    if gpu_mem_mib < 160 * 1024:
        return 256 if tp < 4 else 512
    return 512


def sglang_default_mem_fraction(
    gpu_mem_mib: float,
    tp: int,
    pp: int,
    chunked_prefill_size: int,
    max_running_requests: int | None,
    max_prefill_tokens: int = 16384,
) -> float:
    """SGLang 0.5.23's computed default mem_fraction_static (arg_groups/memory_hook.py
    handle_gpu_memory_settings) on CUDA for a text model without DP attention, DeepEP or
    disaggregation (trtkv serves no other kind): reserved MiB = 512 + 1.5 x max(chunk, 2048) + tp x
    pp / 8 x 1024 + 2 x the decode graphs' max batch + 8 per prefill graph bucket (breakable prefill
    graphs, the CUDA default), at least 10 GiB above 60 GiB of memory; fraction = round((gpu -
    reserved) / gpu, 3). A chunk of -1 (chunked prefill off) takes max_prefill_tokens and captures
    no prefill graph."""
    max_bs = sglang_decode_graph_max_bs(gpu_mem_mib, tp)
    if max_running_requests is not None:
        max_bs = min(max_bs, max_running_requests)
    activation_tokens = max(
        chunked_prefill_size if chunked_prefill_size > 0 else max_prefill_tokens, 2048
    )
    prefill_graphs = (
        len(sglang_prefill_graph_sizes(chunked_prefill_size)) if chunked_prefill_size > 0 else 0
    )
    reserved = 512 + activation_tokens * 1.5 + tp * pp / 8 * 1024 + max_bs * 2 + prefill_graphs * 8
    if gpu_mem_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)


def sglang_chunk(recipe: Recipe) -> int:
    """--chunked-prefill-size as trtkv's SGLang command passes it (-1 when prompts fit
    max_num_tokens)."""
    return recipe.build.max_num_tokens if recipe.chunked_context else -1


def _cap_tokens(recipe: Recipe) -> int | None:
    gib = recipe.triton.kv_pool_gib_per_gpu
    per_token = kv_bytes_per_token_per_gpu(recipe) if gib is not None else None
    return None if gib is None or not per_token else int(gib * GIB // per_token)


def vllm_knobs(recipe: Recipe) -> EngineKnobs:
    """vLLM: --gpu-memory-utilization always (its default resolved), --kv-cache-memory-bytes when
    the pool is pinned (triton.kv_pool_gib_per_gpu; on the CPU max_batch_size sequences unless the
    recipe sets a knob)."""
    t = recipe.triton
    pin = None if t.kv_pool_gib_per_gpu is None else int(t.kv_pool_gib_per_gpu * GIB)
    if recipe.hardware.gpu is GPU.CPU and pin is None and t.gpu_memory_utilization is None:
        pin = cpu_pin_bytes(recipe)
    util = t.gpu_memory_utilization
    return EngineKnobs(
        "--gpu-memory-utilization",
        VLLM_DEFAULT_UTIL if util is None else util,
        util is None,
        "--kv-cache-memory-bytes" if pin is not None else None,
        pin,
    )


def sglang_knobs(recipe: Recipe) -> EngineKnobs:
    """SGLang: --mem-fraction-static always (SGLang 0.5.23's computed default resolved here),
    --max-total-tokens when triton.kv_pool_gib_per_gpu caps the pool."""
    b, msf = recipe.build, recipe.triton.mem_fraction_static
    value = (
        msf
        if msf is not None
        else sglang_default_mem_fraction(
            gpu_memory_mib(recipe), b.tp_size, b.pp_size, sglang_chunk(recipe), b.max_batch_size
        )
    )
    cap = _cap_tokens(recipe)
    return EngineKnobs(
        "--mem-fraction-static",
        value,
        msf is None,
        "--max-total-tokens" if cap is not None else None,
        cap,
    )


def trtllm_knobs(recipe: Recipe, flag: str, cap_flag: str) -> EngineKnobs:
    """TensorRT-LLM (LLM API: kv_cache_config.free_gpu_memory_fraction / max_tokens; engine path:
    kv_cache_free_gpu_mem_fraction / max_tokens_in_paged_kv_cache): the fraction always, the token
    cap when triton.kv_pool_gib_per_gpu caps the pool."""
    frac = recipe.triton.kv_cache_free_gpu_mem_fraction
    cap = _cap_tokens(recipe)
    return EngineKnobs(
        flag,
        TRTLLM_DEFAULT_FRACTION if frac is None else frac,
        frac is None,
        cap_flag if cap is not None else None,
        cap,
    )


def no_knobs(recipe: Recipe) -> EngineKnobs:
    """The reference runtime: max_batch_size caches of max_seq_len, no memory knob."""
    return EngineKnobs(None, None, True)


# ---------------------------------------------------------------------------------------------
# The pool a running engine reports (`trtkv status`, `trtkv bench`: planned against served)


@dataclass(frozen=True)
class ServedPool:
    """The KV pool a running engine reports on one GPU: bytes (tokens x bytes per token where it
    reports tokens), tokens when it says, and where the figure was read."""

    pool_bytes: float | None
    tokens: int | None
    source: str


_PROM_LINE = re.compile(r"^vllm:cache_config_info\{(?P<labels>[^}]*)\}", re.MULTILINE)
_PROM_LABEL = re.compile(r'(\w+)="([^"]*)"')
VLLM_METRICS = "vLLM /metrics vllm:cache_config_info"
VLLM_LOG = "vLLM log 'KV cache size: N tokens'"
SGLANG_INFO = "SGLang /get_server_info"
TRTLLM_LOG = "TensorRT-LLM log 'Allocated X GiB for max tokens in paged KV cache (N)'"
REFERENCE_LOG = "reference runtime log 'trtkv reference runtime KV pool: N bytes'"


def vllm_metrics_blocks(text: str) -> tuple[int, int] | None:
    """(num_gpu_blocks, block_size) from vLLM's /metrics (the vllm:cache_config_info gauge's labels;
    on the CPU num_gpu_blocks counts the CPU pool's blocks); None when the gauge or a label is
    absent, ReadBackError when a label is not a whole number in range."""
    found = _PROM_LINE.search(text)
    if found is None:
        return None
    labels = dict(_PROM_LABEL.findall(found.group("labels")))
    if "num_gpu_blocks" not in labels or "block_size" not in labels:
        return None
    blocks = whole(labels["num_gpu_blocks"], VLLM_METRICS, "num_gpu_blocks", MAX_POOL_TOKENS)
    size = whole(labels["block_size"], VLLM_METRICS, "block_size", 1 << 20, low=1)
    whole(blocks * size, VLLM_METRICS, "num_gpu_blocks x block_size", MAX_POOL_TOKENS)
    return blocks, size


_VLLM_LOG_TOKENS = re.compile(r"(?:GPU|CPU) KV cache size: ([\d,]+) tokens")


def vllm_log_tokens(text: str) -> int | None:
    """vLLM's startup line 'GPU KV cache size: N tokens' ('CPU ...' on the CPU); the last one
    printed."""
    found = _VLLM_LOG_TOKENS.findall(text)
    return whole(found[-1], VLLM_LOG, "tokens", MAX_POOL_TOKENS) if found else None


def sglang_info_tokens(info: dict[str, Any]) -> int | None:
    """max_total_num_tokens from SGLang's /get_server_info (top level, or its scheduler's
    internal_states); None when absent, ReadBackError when not a whole number in range."""
    value = info.get("max_total_num_tokens")
    states = info.get("internal_states")
    if value is None and isinstance(states, list) and states and isinstance(states[0], dict):
        value = states[0].get("max_total_num_tokens")
    if value is None:
        return None
    return whole(value, SGLANG_INFO, "max_total_num_tokens", MAX_POOL_TOKENS)


_TRTLLM_ALLOCATED = re.compile(r"Allocated ([\d.]+) GiB for max tokens in paged KV cache \((\d+)\)")


def trtllm_log_pool(text: str) -> tuple[float, int] | None:
    """TensorRT-LLM's '[MemUsageChange] Allocated X GiB for max tokens in paged KV cache (N)':
    (bytes, tokens), the last one printed (the LLM API allocates twice: the estimation cache, then
    the pool)."""
    found = _TRTLLM_ALLOCATED.findall(text)
    if not found:
        return None
    gib, tokens = found[-1]
    return (
        real(gib, TRTLLM_LOG, "GiB", MAX_POOL_BYTES / GIB) * GIB,
        whole(tokens, TRTLLM_LOG, "tokens", MAX_POOL_TOKENS),
    )


REFERENCE_POOL_LINE = (
    "trtkv reference runtime KV pool: {bytes} bytes ({batch} requests x {seq} "
    "tokens x {per_token} bytes)"
)
_REFERENCE_POOL = re.compile(
    r"trtkv reference runtime KV pool: (\d+) bytes \((\d+) requests x (\d+) tokens"
)


def reference_log_pool(text: str) -> tuple[float, int] | None:
    """The reference runtime's own line (REFERENCE_POOL_LINE): (bytes, tokens = requests x
    tokens)."""
    found = _REFERENCE_POOL.findall(text)
    if not found:
        return None
    total, batch, seq = found[-1]
    tokens = whole(batch, REFERENCE_LOG, "requests", MAX_POOL_TOKENS) * whole(
        seq, REFERENCE_LOG, "tokens", MAX_POOL_TOKENS
    )
    return (
        float(whole(total, REFERENCE_LOG, "bytes", MAX_POOL_BYTES)),
        whole(tokens, REFERENCE_LOG, "requests x tokens", MAX_POOL_TOKENS),
    )
