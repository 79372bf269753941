"""The text of the recipe `trtkv init` writes: every fact with the config.json field it came from,
then the engine settings (quantization, build, hardware) and the calibration/bench/probe sections
sized for the target (a GPU or the CPU). Text only: the figures counted from the checkpoint's shapes
come in (trtkv.checkpoints.params, which reads recipes and so cannot be read from here), and
trtkv.recipe.settle checks that the text validates and plans.

Untrusted text from a config.json or a path only ever lands inside a YAML comment (escaped so the
comment cannot end early) or a double-quoted scalar.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from trtkv.core.tools import quote
from trtkv.recipe.attention import compact_layers, summary
from trtkv.recipe.settle import Settings
from trtkv.units import GIB

if TYPE_CHECKING:
    from pathlib import Path

    from trtkv.checkpoints.model_facts import ModelFacts
    from trtkv.checkpoints.params import ParamCount

DEFAULT_SEQ_LEN = 32768
# needle haystacks and probe lengths on a GPU (as recipes/_base/gpu_serving)
GPU_LENGTHS = (1024, 4096, 16384, 32768)
# the schema's probe lengths (a CPU forward pass per length)
CPU_LENGTHS = (512, 1024, 2048, 4096, 8192)
# model_type -> the decoder type of ModelOpt's / TensorRT-LLM's export (model.architecture)
DECODERS = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen",
    "qwen3": "qwen",
    "qwen2_moe": "qwen",
    "qwen3_moe": "qwen",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
    "gemma3_text": "gemma3",
    "gpt_oss": "gpt_oss",
    "llama4": "llama4",
    "llama4_text": "llama4",
    "deepseek_v2": "deepseek_v2",
    "deepseek_v3": "deepseek_v3",
    "kimi_k2": "deepseek_v3",
    "mixtral": "llama",
}


def render(
    name: str,
    facts: ModelFacts,
    source: Path,
    settings: Settings,
    *,
    params: ParamCount,
    stored: float | None,
) -> str:
    """The recipe text: the header, the model section (every fact with the config field it came
    from), then the engine settings and the sections sized for the target. `params` and `stored`
    (bytes as stored, None when the checkpoint is not pre-quantized) are counted from the shapes by
    trtkv.checkpoints.params."""
    tp, pp = split(facts, settings.count)
    mpe = facts.max_position_embeddings or DEFAULT_SEQ_LEN
    lines = _header(name, facts, settings, params, stored) + _model_lines(
        facts, source, params, stored
    )
    lines += engine_lines(settings, tp, pp, mpe)
    lines += section_lines(settings, settings.gpu == "cpu")
    return "\n".join(lines) + "\n"


def split(facts: ModelFacts, count: int) -> tuple[int, int]:
    """TP within a node (8 GPUs), PP over nodes; TP must divide the heads and split or replicate the
    KV heads."""
    tp = min(count, 8)
    while tp > 1 and (
        facts.num_attention_heads % tp
        or not (facts.num_kv_heads % tp == 0 or tp % facts.num_kv_heads == 0)
    ):
        tp //= 2
    return tp, count // tp


def _engines(arch: str) -> str:
    """The engines that run this architecture, in words (a header comment)."""
    # the families trtkv's CPU runtime reads (trtkv.runtime)
    reference = arch in ("llama", "gemma3")
    return (
        "TensorRT-LLM's LLM API (backend llmapi, any release), vLLM (backend vllm), SGLang "
        "(backend sglang, GPU)"
        + (
            "; the trtllm-build engine path (backend tensorrt, TensorRT-LLM <= 1.2) is "
            "Llama-family only in trtkv" + ("" if arch == "llama" else ": not for this model")
        )
        + (
            "; the CPU reference runtime (backend reference) runs it"
            if reference
            else "; the CPU reference runtime (backend reference) runs Llama-family and Gemma 3 "
            "models only"
        )
    )


def _header(
    name: str, facts: ModelFacts, settings: Settings, params: ParamCount, stored: float | None
) -> list[str]:
    """The comments on top (how to plan it, where the facts came from, the engines) and the
    description."""
    mpe = facts.max_position_embeddings or DEFAULT_SEQ_LEN
    arch = DECODERS.get(facts.model_type, facts.model_type or "llama")
    moe = (
        f"\n# MoE: {facts.moe.source}; {params.experts / 1e9:.1f}B expert parameters counted in "
        "num_parameters."
        if facts.moe
        else ""
    )
    quant = (
        f"\n# Stored weights: {facts.quant.source}, priced as stored ({stored / GIB:.1f} GiB)."
        if facts.quant and stored
        else ""
    )
    notes = "".join(f"\n# Note: {n}" for n in facts.notes)
    sinks = f"\n# {facts.sinks}" if facts.sinks else ""
    described = (
        f"{name}: {facts.model_type}, {summary(facts.layers)}, {settings.kv} KV on "
        f"{settings.count} x {settings.gpu}"
    )
    return [
        comment_line(
            f"# trtkv plan {name}    (written by `trtkv init {name} --model "
            f"{quote([str(facts.path)])}`)"
        ),
        f"# Override example: trtkv plan {name} build.max_seq_len={mpe} hardware.gpu=H200-141GB",
        *(
            comment_line(line)
            for line in (
                f"# Read from {comment_line(str(facts.path))} ({facts.model_type}, "
                f"{', '.join(facts.architectures) or 'no architectures'})."
                f"{moe}{quant}{sinks}{notes}"
            ).split("\n")
        ),
        f"# Engines for this architecture: {_engines(arch)}.",
        f"description: {quoted(described)}",
    ]


def _model_lines(
    facts: ModelFacts, source: Path, params: ParamCount, stored: float | None
) -> list[str]:
    """The model section: each fact with the config.json field it came from."""
    p = facts.prefix
    dtype = facts.dtype if facts.dtype in ("bfloat16", "float16") else "bfloat16"
    arch = DECODERS.get(facts.model_type, facts.model_type or "llama")
    lines: list[str] = [
        "model:",
        f"  source: {quoted(str(source))}   # a hub id (org/name) works too: the facts below plan "
        "without the config",
        f"  architecture: {quoted(arch)}",
        comment_line(
            f"  dtype: {dtype}                      # config {p}torch_dtype: "
            f"{facts.dtype or 'absent'}"
        ),
        f"  num_layers: {facts.num_layers}                     # {p}num_hidden_layers",
        f"  num_attention_heads: {facts.num_attention_heads}            # {p}num_attention_heads",
        f"  num_kv_heads: {facts.num_kv_heads}                   # {p}num_key_value_heads"
        + (" (MLA: the KV is one latent, see kv_lora_rank)" if facts.kv_lora_rank else ""),
        f"  head_dim: {facts.head_dim}                      # "
        + (
            f"{p}qk_nope_head_dim + {p}qk_rope_head_dim"
            if facts.kv_lora_rank
            else f"{p}head_dim or hidden/heads"
        ),
        f"  hidden_size: {facts.hidden_size}                   # {p}hidden_size",
    ]
    for key, value in (
        ("intermediate_size", facts.intermediate_size),
        ("vocab_size", facts.vocab_size),
        ("max_position_embeddings", facts.max_position_embeddings),
    ):
        if value:
            lines.append(f"  {key}: {value}   # {p}{key}")
    lines.append(
        f"  num_parameters: {params.total:.6g}   # counted from the shapes "
        f"({params.active_per_token / 1e9:.1f}B active per token)"
    )
    lines.append(f"  attention_layers: [{', '.join(compact_layers(facts.layers))}]")
    lines.append(f"  attention_source: {quoted(f'{facts.path.name} {facts.attention_source}')}")
    if facts.state is not None:
        lines.append(
            comment_line(
                f"  state_layers: {_flow(facts.state.to_dict())}   # fixed per-sequence state of "
                f"the linear/mamba layers: {one_line(facts.state.source)}"
            )
        )
    if facts.kv_lora_rank:
        lines.append(f"  kv_lora_rank: {facts.kv_lora_rank}   # {p}kv_lora_rank")
        lines.append(f"  qk_rope_head_dim: {facts.qk_rope_head_dim}   # {p}qk_rope_head_dim")
    if stored:
        lines.append(
            comment_line(
                f"  checkpoint_weights_gib: {stored / GIB:.4g}   # as stored "
                f"({facts.quant.method if facts.quant else ''})"
            )
        )
    if facts.quant and facts.quant.stored_format:
        lines.append(
            comment_line(
                f"  checkpoint_quant: {quoted(facts.quant.stored_format)}   # the weights' stored "
                "format: used as stored with quantization.weights none, never quantized again"
            )
        )
    return lines


def engine_lines(s: Settings, tp: int, pp: int, mpe: int) -> list[str]:
    """The quantization, build and hardware sections, each chosen value with where it came from."""
    weights = s.why.get(
        "quantization.weights", "the checkpoint's own precision" if s.weights == "none" else ""
    )
    kv = s.why.get("quantization.kv_cache", "")
    batch = s.why.get("build.max_batch_size", "")
    tokens = s.why.get(
        "build.max_num_tokens", "tokens per engine step (vLLM's max_num_batched_tokens)"
    )
    return [
        "quantization:",
        f"  weights: {s.weights}" + (f"   # {one_line(weights)}" if weights else ""),
        f"  kv_cache: {s.kv}" + (f"   # {one_line(kv)}" if kv else ""),
        "build:",
        f"  backend: {s.backend}",
        f"  max_batch_size: {s.batch}" + (f"   # {one_line(batch)}" if batch else ""),
        f"  max_input_len: {s.input_len}",
        f"  max_seq_len: {s.seq_len}                # up to max_position_embeddings {mpe}",
        f"  max_num_tokens: {s.num_tokens}   # {one_line(tokens)}",
        f"  tp_size: {tp}",
        f"  pp_size: {pp}",
        *[
            f"  {key}: {value}" + (f"   # {one_line(why)}" if why else "")
            for key, value, why in (
                ("ep_size", s.ep, s.why.get("build.ep_size")),
                ("attention_dp_size", s.attention_dp, s.why.get("build.attention_dp_size")),
            )
            if value > 1
        ],
        "hardware:",
        f"  gpu: {s.gpu}",
        f"  count: {tp * pp}",
    ]


def section_lines(s: Settings, on_cpu: bool) -> list[str]:
    """calibration (GPU only: 512 x 512), bench and probe sized to the recipe's lengths and
    batch."""
    seq, inp = s.seq_len, s.input_len
    out: list[str] = []
    if not on_cpu:
        out += [
            "calibration:                       # GPU-sized, as recipes/_base/gpu_serving.yaml",
            "  num_samples: 512",
            f"  seq_len: {min(512, inp)}",
            "  batch_size: 8",
        ]
    sweep = (
        [c for c in (1, 2, 4) if c <= s.batch]
        if on_cpu
        else [c for c in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if c < s.batch] + [s.batch]
    )
    input_tokens, output_tokens = s.bench_input_tokens, s.bench_output_tokens
    lengths = GPU_LENGTHS if not on_cpu else (512,)
    needle = [n for n in lengths if n <= inp] or [inp]
    ruler = [n for n in (4096, 16384, 32768) if n <= seq] or [seq]
    out += [
        "bench:                             # the sweep up to max_batch_size; prompts within "
        "max_input_len",
        f"  concurrency: [{', '.join(map(str, sweep))}]",
        f"  input_tokens: {input_tokens}",
        f"  output_tokens: {output_tokens}",
        f"  num_requests: {max(16 if on_cpu else 64, 2 * sweep[-1])}",
        f"  warmup_requests: {2 if on_cpu else 4}",
        f"  needle_context_lengths: [{', '.join(map(str, needle))}]",
        f"  ruler_lengths: [{', '.join(map(str, ruler))}]",
    ]
    probe = sorted(
        {n for n in (CPU_LENGTHS if on_cpu else GPU_LENGTHS) if n <= seq}
        | ({seq} if not on_cpu else set())
    )
    out += ["probe:", f"  lengths: [{', '.join(map(str, probe or [seq]))}]   # up to max_seq_len"]
    return out


def _flow(data: dict[str, object]) -> str:
    """A YAML flow mapping of plain keys and integers / enum words (JSON object syntax is valid
    YAML)."""
    return json.dumps(data)


def comment_line(line: str) -> str:
    """A line whose comment cannot end early: every control, line-break or non-ASCII character is
    escaped (YAML also breaks lines at U+0085, U+2028 and U+2029), so text from a config.json or a
    path stays inside its comment."""
    if line.isascii() and line.isprintable():
        return line
    return "".join(ch if ch.isascii() and ch.isprintable() else json.dumps(ch)[1:-1] for ch in line)


def one_line(text: str) -> str:
    """Text safe inside a YAML comment: one line."""
    return " ".join(str(text).split())


def quoted(text: str) -> str:
    """A YAML double-quoted scalar (JSON string syntax is valid YAML)."""
    return json.dumps(text)
