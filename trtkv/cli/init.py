"""`trtkv init`: write a commented recipe from a model's config.json that validates and plans at once."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from trtkv.cli.common import subparser

if TYPE_CHECKING:
    from trtkv.checkpoints import ModelFacts

GIB = 1024**3
COUNTS = (1, 2, 4, 8, 16, 32, 64)  # GPUs tried when --count is not given: TP within a node, then PP over nodes
DEFAULT_SEQ_LEN = 32768
# model_type -> the decoder type of ModelOpt's / TensorRT-LLM's export (model.architecture)
DECODERS = {"llama": "llama", "mistral": "llama", "qwen2": "qwen", "qwen3": "qwen", "qwen2_moe": "qwen",
            "qwen3_moe": "qwen", "gemma2": "gemma2", "gemma3": "gemma3", "gemma3_text": "gemma3", "gpt_oss": "gpt_oss",
            "llama4": "llama4", "llama4_text": "llama4", "deepseek_v2": "deepseek_v2", "deepseek_v3": "deepseek_v3",
            "kimi_k2": "deepseek_v3", "mixtral": "llama"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    from trtkv.platform.hardware import GPU
    from trtkv.recipe import Backend, KVCacheQuant

    p = subparser(sub, "init",
                  "  $ trtkv init gemma3_27b_fp8kv --model ~/models/gemma-3-27b-it\n"
                  "  $ trtkv init dsv3_fp8kv --model config.json --gpu H200-141GB --count 8\n"
                  "  $ trtkv init scout --model DIR --output /tmp/scout.yaml --backend vllm && trtkv plan /tmp/scout.yaml\n")
    p.add_argument("name", help="recipe name: lower-case letters, digits, '_' and '-'")
    p.add_argument("--model", required=True, type=Path, help="model folder holding config.json, or the config.json")
    p.add_argument("--output", type=Path, default=None, help="recipe file to write (default recipes/NAME.yaml)")
    p.add_argument("--gpu", default=GPU.H100_80GB.value, choices=[g.value for g in GPU], help="target GPU")
    p.add_argument("--count", type=int, default=None, help="GPUs per model instance (default: the fewest that hold "
                   "the weights and one sequence of max_seq_len)")
    p.add_argument("--kv-cache", default=None, choices=[k.value for k in KVCacheQuant],
                   help="KV-cache precision (default fp8 where the GPU has FP8, else none)")
    p.add_argument("--backend", default=None, choices=[b.value for b in Backend],
                   help=f"engine (default {Backend.LLMAPI.value} on a GPU; on {GPU.CPU.value} {Backend.REFERENCE.value} "
                        f"for Llama-family models, else {Backend.VLLM.value})")
    p.add_argument("--force", action="store_true", help="overwrite an existing recipe file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = write_recipe(args.name, args.model, args.output, args.gpu, args.count, args.kv_cache, args.backend, args.force)
    print(f"wrote {out}\nNext: trtkv plan {out}")
    return 0


def write_recipe(name: str, model: Path, output: Path | None = None, gpu: str = "H100-80GB", count: int | None = None,
                 kv_cache: str | None = None, backend: str | None = None, force: bool = False) -> Path:
    """Read the config, size TP/PP with the planner, write the recipe atomically once it validates and plans."""
    from trtkv.checkpoints import config_file, read_model_facts
    from trtkv.core import paths
    from trtkv.core.errors import RecipeError
    from trtkv.platform.hardware import GPU, GPU_SPECS
    from trtkv.recipe.names import check_recipe_name

    out = (output or paths.recipes_dir() / f"{name}.yaml").expanduser()
    check_recipe_name(name, out)
    if output is not None and out.stem != name:
        raise RecipeError([f"--output {out}: a recipe's name is its file name; {out.stem!r} is not {name!r}. Next: "
                           f"--output {out.with_name(name + '.yaml')}"], header="Recipe not written")
    if out.exists() and not force:
        raise RecipeError([f"{out}: already exists; trtkv init never replaces a recipe. Next: pick another NAME or "
                           f"--output, or pass --force to overwrite it."], header="Recipe not written")
    facts = read_model_facts(model.expanduser())
    target = GPU(gpu)
    on_cpu = target is GPU.CPU
    kv = kv_cache or ("fp8" if on_cpu or GPU_SPECS[target].has_fp8 else "none")
    llama = DECODERS.get(facts.model_type) == "llama"
    from trtkv.backends import default_backend

    chosen = backend or default_backend(on_cpu=on_cpu, llama_family=llama).value  # as --help says
    source = config_file(model.expanduser()).resolve().parent
    tried: list[str] = []
    for n in ([count] if count else [1] if on_cpu else list(COUNTS)):
        text = render(name, facts, source, target.value, n, kv, chosen)
        fits, why = _check(name, text)
        if fits or count or on_cpu:
            break
        tried.append(f"{n} x {target.value}: {why}")
    else:
        raise RecipeError([f"{facts.path}: no count in {COUNTS} of {target.value} holds the weights and one sequence "
                           f"of max_seq_len ({'; '.join(tried)}). Next: a larger GPU (--gpu), --count N, or "
                           f"--kv-cache fp8."], header="Recipe not written")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)
    return out


def _check(name: str, text: str) -> tuple[bool, str]:
    """Load the text as the recipe `name` (every rule) and plan it: (recipe, one sequence fits, why not)."""
    from trtkv.plan.planner import plan
    from trtkv.recipe import load_recipe

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.yaml"
        path.write_text(text, encoding="utf-8")
        recipe = load_recipe(path)
        p = plan(recipe)
    cap = next(c for c in p.formats if c.format == p.recipe_kv_format)
    fits = cap.max_sequences.get(recipe.build.max_seq_len, 0) >= 1
    why = "" if fits else (f"{p.weights.per_gpu_gib:.0f} GiB of weights per GPU leave "
                           f"{p.kv_budget_gib_per_gpu:.1f} GiB for KV")
    return fits, why


def _split(facts: ModelFacts, count: int) -> tuple[int, int]:
    """TP within a node (8 GPUs), PP over nodes; TP must divide the heads and split or replicate the KV heads."""
    tp = min(count, 8)
    while tp > 1 and (facts.num_attention_heads % tp or not (facts.num_kv_heads % tp == 0 or tp % facts.num_kv_heads == 0)):
        tp //= 2
    return tp, count // tp


def render(name: str, facts: ModelFacts, source: Path, gpu: str, count: int, kv: str, backend: str) -> str:
    """The recipe text: every fact with the config field it came from."""
    from trtkv.checkpoints import compact_layers, count_parameters, stored_weight_bytes, summary

    params = count_parameters(facts)
    dtype = facts.dtype if facts.dtype in ("bfloat16", "float16") else "bfloat16"
    stored = stored_weight_bytes(facts, params, 2.0)
    tp, pp = _split(facts, count)
    mpe = facts.max_position_embeddings or DEFAULT_SEQ_LEN
    seq = min(mpe, DEFAULT_SEQ_LEN)
    p = facts.prefix
    arch = DECODERS.get(facts.model_type, facts.model_type or "llama")
    reference = arch in ("llama", "gemma3")  # the families trtkv's CPU runtime reads (trtkv.runtime)
    engines = ("TensorRT-LLM's LLM API (backend llmapi, any release), vLLM (backend vllm), SGLang (backend sglang, "
               "GPU)" + ("; the trtllm-build engine path (backend tensorrt, TensorRT-LLM <= 1.2) is Llama-family only "
                         "in trtkv" + ("" if arch == "llama" else ": not for this model"))
               + ("; the CPU reference runtime (backend reference) runs it" if reference else
                  "; the CPU reference runtime (backend reference) runs Llama-family and Gemma 3 models only"))
    moe = (f"\n# MoE: {facts.moe.source}; {params.experts / 1e9:.1f}B expert parameters counted in num_parameters."
           if facts.moe else "")
    quant = f"\n# Stored weights: {facts.quant.source}, priced as stored ({stored / GIB:.1f} GiB)." if \
        facts.quant and stored else ""
    notes = "".join(f"\n# Note: {n}" for n in facts.notes)
    sinks = f"\n# {facts.sinks}" if facts.sinks else ""
    lines: list[str] = [
        f"# trtkv plan {name}    (written by `trtkv init {name} --model {facts.path}`)",
        f"# Override example: trtkv plan {name} build.max_seq_len={mpe} hardware.gpu=H200-141GB",
        f"# Read from {facts.path} ({facts.model_type}, {', '.join(facts.architectures) or 'no architectures'})."
        f"{moe}{quant}{sinks}{notes}",
        f"# Engines for this architecture: {engines}.",
        f"description: {_q(f'{name}: {facts.model_type}, {summary(facts.layers)}, {kv} KV on {count} x {gpu}')}",
        "model:",
        f"  source: {_q(str(source))}   # a hub id (org/name) works too: the facts below plan without the config",
        f"  architecture: {arch}",
        f"  dtype: {dtype}                      # config {p}torch_dtype: {facts.dtype or 'absent'}",
        f"  num_layers: {facts.num_layers}                     # {p}num_hidden_layers",
        f"  num_attention_heads: {facts.num_attention_heads}            # {p}num_attention_heads",
        f"  num_kv_heads: {facts.num_kv_heads}                   # {p}num_key_value_heads"
        + (" (MLA: the KV is one latent, see kv_lora_rank)" if facts.kv_lora_rank else ""),
        f"  head_dim: {facts.head_dim}                      # "
        + (f"{p}qk_nope_head_dim + {p}qk_rope_head_dim" if facts.kv_lora_rank else f"{p}head_dim or hidden/heads"),
        f"  hidden_size: {facts.hidden_size}                   # {p}hidden_size",
    ]
    for key, value, field in (("intermediate_size", facts.intermediate_size, "intermediate_size"),
                              ("vocab_size", facts.vocab_size, "vocab_size"),
                              ("max_position_embeddings", facts.max_position_embeddings, "max_position_embeddings")):
        if value:
            lines.append(f"  {key}: {value}   # {p}{field}")
    lines.append(f"  num_parameters: {params.total:.6g}   # counted from the shapes ({params.active_per_token / 1e9:.1f}B "
                 f"active per token)")
    lines.append(f"  attention_layers: [{', '.join(compact_layers(facts.layers))}]")
    lines.append(f"  attention_source: {_q(f'{facts.path.name} {facts.attention_source}')}")
    if facts.kv_lora_rank:
        lines.append(f"  kv_lora_rank: {facts.kv_lora_rank}   # {p}kv_lora_rank")
        lines.append(f"  qk_rope_head_dim: {facts.qk_rope_head_dim}   # {p}qk_rope_head_dim")
    if stored:
        lines.append(f"  checkpoint_weights_gib: {stored / GIB:.4g}   # as stored ({facts.quant.method if facts.quant else ''})")
    lines += [
        "quantization:",
        "  weights: none                    # the checkpoint's own precision",
        f"  kv_cache: {kv}",
        "build:",
        f"  backend: {backend}",
        "  max_batch_size: 16",
        f"  max_input_len: {seq // 2}",
        f"  max_seq_len: {seq}                # up to max_position_embeddings {mpe}",
        "  max_num_tokens: 8192             # tokens per engine step (vLLM's max_num_batched_tokens)",
        f"  tp_size: {tp}",
        f"  pp_size: {pp}",
        "hardware:",
        f"  gpu: {gpu}",
        f"  count: {tp * pp}",
    ]
    return "\n".join(lines) + "\n"


def _q(text: str) -> str:
    """A YAML double-quoted scalar (JSON string syntax is valid YAML)."""
    import json

    return json.dumps(text)
