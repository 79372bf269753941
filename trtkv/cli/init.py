"""`trtkv init`: write a commented recipe from a model's config.json that validates and plans at once."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from pydantic import Field, field_validator

from trtkv.cli.common import subparser
from trtkv.core.options import Flag, Options
from trtkv.platform.hardware import GPU, gpu_from_name, known_gpus
from trtkv.recipe import Backend, KVCacheQuant, WeightQuant

if TYPE_CHECKING:
    from trtkv.checkpoints import ModelFacts
    from trtkv.cli.init_sizing import Settings
    from trtkv.recipe import Recipe

GIB = 1024**3
COUNTS = (1, 2, 4, 8, 16, 32, 64)  # GPUs tried when --count is not given: TP within a node, then PP over nodes
DEFAULT_SEQ_LEN = 32768
DEFAULT_GPU = GPU.H100_80GB
SETTLE_ROUNDS = 4  # max_batch_size re-sized to what fits with itself as the engine's max_num_seqs (1 round in practice)
# model_type -> the decoder type of ModelOpt's / TensorRT-LLM's export (model.architecture)
DECODERS = {"llama": "llama", "mistral": "llama", "qwen2": "qwen", "qwen3": "qwen", "qwen2_moe": "qwen",
            "qwen3_moe": "qwen", "gemma2": "gemma2", "gemma3": "gemma3", "gemma3_text": "gemma3", "gpt_oss": "gpt_oss",
            "llama4": "llama4", "llama4_text": "llama4", "deepseek_v2": "deepseek_v2", "deepseek_v3": "deepseek_v3",
            "kimi_k2": "deepseek_v3", "mixtral": "llama"}


class InitOptions(Options):
    """`trtkv init NAME --model PATH [options]`: each field one argument (trtkv.core.options)."""

    name: Annotated[str, Field(description="recipe name: lower-case letters, digits, '_' and '-'"), Flag(names=("name",))]
    model: Annotated[Path, Field(description="model folder holding config.json, or the config.json"), Flag()]
    output: Annotated[Path | None, Field(description="recipe file to write (default recipes/NAME.yaml)"), Flag()] = None
    gpu: Annotated[str, Field(description=f"target GPU, as trtkv names it or as nvidia-smi prints it (e.g. 'NVIDIA "
                                          f"H100 80GB HBM3'): {known_gpus()}"), Flag(metavar="GPU")] = DEFAULT_GPU.value
    count: Annotated[int | None, Field(
        description="GPUs per model instance (default: the fewest that hold the weights and one sequence of "
                    "max_seq_len)"), Flag()] = None
    kv_cache: Annotated[KVCacheQuant | None, Field(
        description="KV-cache precision (default fp8 where the GPU has FP8, else none)"), Flag()] = None
    backend: Annotated[Backend | None, Field(
        description=f"engine (default {Backend.LLMAPI.value} on a GPU; on {GPU.CPU.value} {Backend.REFERENCE.value} "
                    f"for Llama-family models, else {Backend.VLLM.value})"), Flag()] = None
    weights: Annotated[WeightQuant | None, Field(
        description="weight quantization (default none, the checkpoint's own precision; fp8 where the engine refuses "
                    "none with the KV cache asked for, e.g. vLLM's ModelOpt loader)"), Flag()] = None
    max_seq_len: Annotated[int | None, Field(
        ge=1, description=f"prompt + answer tokens (default the model's max_position_embeddings, at most "
                          f"{DEFAULT_SEQ_LEN}); max_input_len is 7/8 of it"), Flag(metavar="TOKENS")] = None
    concurrency: Annotated[int | None, Field(
        ge=1, description="sequences of max_seq_len served at once: max_batch_size (vLLM's max_num_seqs), and --count "
                          "grows until N fit (default: what fits on the fewest GPUs holding one, at most 256)"),
        Flag(metavar="N")] = None
    force: Annotated[bool, Field(description="overwrite an existing recipe file"), Flag()] = False

    @field_validator("gpu")
    @classmethod
    def _any_gpu_name(cls, value: str) -> str:
        """trtkv's name, nvidia-smi's or GPU feature discovery's, as trtkv's value."""
        gpu = gpu_from_name(value)
        if gpu is None:
            raise ValueError(f"unknown GPU: use one of {known_gpus()} (or its name as nvidia-smi prints it); for "
                             f"another GPU pick the nearest and set hardware.memory_gib in the recipe")
        return gpu.value


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = subparser(sub, "init",
                  "  $ trtkv init gemma3_27b_fp8kv --model ~/models/gemma-3-27b-it\n"
                  "  $ trtkv init dsv3_fp8kv --model config.json --gpu H200-141GB --count 8\n"
                  "  $ trtkv init scout --model DIR --output /tmp/scout.yaml --backend vllm && trtkv plan /tmp/scout.yaml\n")
    InitOptions.add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    o = InitOptions.from_args(args)
    out = write_recipe(o.name, o.model, o.output, o.gpu, o.count, o.kv_cache.value if o.kv_cache else None,
                       o.backend.value if o.backend else None, o.force, weights=o.weights.value if o.weights else None,
                       max_seq_len=o.max_seq_len, concurrency=o.concurrency)
    print(f"wrote {out}\nNext: trtkv plan {out}")
    return 0


def write_recipe(name: str, model: Path, output: Path | None = None, gpu: str = DEFAULT_GPU.value,
                 count: int | None = None, kv_cache: str | None = None, backend: str | None = None, force: bool = False,
                 *, weights: str | None = None, max_seq_len: int | None = None, concurrency: int | None = None) -> Path:
    """Read the config, size TP/PP and the batch with the planner, write the recipe atomically once its engine accepts
    it (trtkv.cli.init_sizing) and it plans."""
    from trtkv.checkpoints import config_file, read_model_facts
    from trtkv.cli.init_sizing import Settings, batch_for, refusal, settle
    from trtkv.core import paths
    from trtkv.core.errors import RecipeError
    from trtkv.core.files import naming
    from trtkv.platform.hardware import GPU_SPECS
    from trtkv.recipe.limits import RANGES
    from trtkv.recipe.names import check_recipe_name

    out = (output or paths.recipes_dir() / f"{name}.yaml").expanduser()
    check_recipe_name(name, out)
    if output is not None and out.stem != name:
        raise RecipeError([f"--output {out}: a recipe's name is its file name; {out.stem!r} is not {name!r}. Next: "
                           f"--output {out.with_name(name + '.yaml')}"], header="Recipe not written")
    for flag, value, bound in (("--count", count, RANGES["gpus"]), ("--max-seq-len", max_seq_len, RANGES["positions"]),
                               ("--concurrency", concurrency, RANGES["batch"])):
        if value is not None and not bound.admits(value):
            raise RecipeError([f"{flag} {value}: must be in {bound.text()}. Next: leave it out to size it from the "
                               f"model."], header="Recipe not written")
    if out.exists() and not force:
        raise RecipeError([f"{out}: already exists; trtkv init never replaces a recipe. Next: pick another NAME or "
                           f"--output, or pass --force to overwrite it."], header="Recipe not written")
    facts = read_model_facts(model.expanduser())
    target = gpu_from_name(gpu) or GPU(gpu)  # GPU(): ValueError naming the unknown value
    on_cpu = target is GPU.CPU
    kv = kv_cache or ("fp8" if on_cpu or GPU_SPECS[target].has_fp8 else "none")
    llama = DECODERS.get(facts.model_type) == "llama"
    from trtkv.backends import default_backend

    chosen = backend or default_backend(on_cpu=on_cpu, llama_family=llama).value  # as --help says
    source = config_file(model.expanduser()).resolve().parent
    mpe = facts.max_position_embeddings or DEFAULT_SEQ_LEN
    given = {flag: str(value) for flag, value in (
        ("--gpu", target.value), ("--count", count), ("--kv-cache", kv_cache), ("--backend", backend),
        ("--weights", weights), ("--max-seq-len", max_seq_len), ("--concurrency", concurrency)) if value is not None}
    need = concurrency or 1
    tried: list[str] = []
    for n in ([count] if count is not None else [1] if on_cpu else list(COUNTS)):
        s = Settings(target.value, n, kv, weights or "none", chosen, max_seq_len or min(mpe, DEFAULT_SEQ_LEN), need)
        s.num_tokens = max(s.num_tokens, need)
        text, recipe = settle(name, out, s, given, lambda s: render(name, facts, source, s))
        fits, why = _fits(recipe)
        if fits >= need or on_cpu:
            break
        tried.append(f"{n} x {target.value}: {why}")
        if count is not None:
            raise refusal(out, [("build.max_batch_size" if fits else "hardware.count",
                                 f"{why}, and {need} sequence(s) of max_seq_len {s.seq_len} are asked for: a larger "
                                 f"GPU (--gpu), more GPUs (--count), a shorter --max-seq-len, a smaller --kv-cache or "
                                 f"a lower --concurrency (more replicas: `trtkv deploy --target-concurrency`)")], given)
    else:
        raise RecipeError([f"{facts.path}: no count in {COUNTS} of {target.value} holds the weights and {need} "
                           f"sequence(s) of max_seq_len ({'; '.join(tried)}). Next: a larger GPU (--gpu), --count N, "
                           f"--kv-cache fp8, or a shorter --max-seq-len."], header="Recipe not written")
    s.batch, s.why["build.max_batch_size"] = batch_for(fits, concurrency, on_cpu)
    for _ in range(SETTLE_ROUNDS):  # the engine's own reserve grows with max_num_seqs (vLLM's sampler rows)
        if s.batch == need:
            break
        s.num_tokens = max(s.num_tokens, s.batch)
        text, recipe = settle(name, out, s, given, lambda s: render(name, facts, source, s))
        fits, _why = _fits(recipe)
        if concurrency is not None or on_cpu or fits >= s.batch:
            break
        s.batch, s.why["build.max_batch_size"] = batch_for(fits, concurrency, on_cpu)
    else:  # settled on the last round's batch: its recipe
        text, recipe = settle(name, out, s, given, lambda s: render(name, facts, source, s))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = paths.temp_sibling(out, "tmp")
    try:
        with naming(tmp):
            tmp.write_text(text, encoding="utf-8")
        if force:
            tmp.replace(out)
        else:  # a hard link never replaces: of two concurrent runs exactly one writes, the other is refused
            _link_new(tmp, out, text)
    except FileExistsError:
        raise RecipeError([f"{out}: already exists (written meanwhile by another run?); trtkv init never replaces a "
                           f"recipe. Next: pick another NAME or --output, or pass --force to overwrite it."],
                          header="Recipe not written") from None
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _link_new(tmp: Path, out: Path, text: str) -> None:
    """Put `tmp` in place as `out` only if `out` does not exist (FileExistsError otherwise); where the file system has
    no hard links, an exclusive create (O_EXCL) written in one go."""
    try:
        os.link(tmp, out)
    except FileExistsError:
        raise
    except OSError:  # no hard links here (FAT, some network mounts)
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)


def _fits(recipe: Recipe) -> tuple[int, str]:
    """Sequences of max_seq_len the recipe's KV format fits per replica (trtkv plan), and the figures in words."""
    from trtkv.plan.planner import plan

    p = plan(recipe)
    cap = next(c for c in p.formats if c.format == p.recipe_kv_format)
    fits = cap.max_sequences.get(recipe.build.max_seq_len, 0)
    return fits, (f"{p.weights.per_gpu_gib:.0f} GiB of weights per GPU leave {p.kv_budget_gib_per_gpu:.1f} GiB for KV: "
                  f"{fits} sequence(s) of {recipe.build.max_seq_len} tokens in {p.recipe_kv_format}")


def _split(facts: ModelFacts, count: int) -> tuple[int, int]:
    """TP within a node (8 GPUs), PP over nodes; TP must divide the heads and split or replicate the KV heads."""
    tp = min(count, 8)
    while tp > 1 and (facts.num_attention_heads % tp or not (facts.num_kv_heads % tp == 0 or tp % facts.num_kv_heads == 0)):
        tp //= 2
    return tp, count // tp


def render(name: str, facts: ModelFacts, source: Path, settings: Settings) -> str:
    """The recipe text: every fact with the config field it came from, then the engine settings and the sections
    sized for the target (trtkv.cli.init_sizing)."""
    from trtkv.checkpoints import count_parameters, stored_weight_bytes
    from trtkv.cli.init_sizing import engine_lines, section_lines
    from trtkv.core.tools import quote
    from trtkv.recipe.attention import compact_layers, summary

    gpu, count, kv = settings.gpu, settings.count, settings.kv

    params = count_parameters(facts)
    dtype = facts.dtype if facts.dtype in ("bfloat16", "float16") else "bfloat16"
    stored = stored_weight_bytes(facts, params, 2.0)
    tp, pp = _split(facts, count)
    mpe = facts.max_position_embeddings or DEFAULT_SEQ_LEN
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
        _c(f"# trtkv plan {name}    (written by `trtkv init {name} --model {quote([str(facts.path)])}`)"),
        f"# Override example: trtkv plan {name} build.max_seq_len={mpe} hardware.gpu=H200-141GB",
        *(_c(line) for line in (f"# Read from {_c(str(facts.path))} ({facts.model_type}, "
                                f"{', '.join(facts.architectures) or 'no architectures'})."
                                f"{moe}{quant}{sinks}{notes}").split("\n")),
        f"# Engines for this architecture: {engines}.",
        f"description: {_q(f'{name}: {facts.model_type}, {summary(facts.layers)}, {kv} KV on {count} x {gpu}')}",
        "model:",
        f"  source: {_q(str(source))}   # a hub id (org/name) works too: the facts below plan without the config",
        f"  architecture: {_q(arch)}",
        _c(f"  dtype: {dtype}                      # config {p}torch_dtype: {facts.dtype or 'absent'}"),
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
    if facts.state is not None:
        lines.append(_c(f"  state_layers: {_q_flow(facts.state.to_dict())}   # fixed per-sequence state of the "
                        f"linear/mamba layers: {_comment(facts.state.source)}"))
    if facts.kv_lora_rank:
        lines.append(f"  kv_lora_rank: {facts.kv_lora_rank}   # {p}kv_lora_rank")
        lines.append(f"  qk_rope_head_dim: {facts.qk_rope_head_dim}   # {p}qk_rope_head_dim")
    if stored:
        lines.append(_c(f"  checkpoint_weights_gib: {stored / GIB:.4g}   # as stored "
                        f"({facts.quant.method if facts.quant else ''})"))
    lines += engine_lines(settings, tp, pp, mpe, gpu == "cpu")
    lines += section_lines(settings, gpu == "cpu")
    return "\n".join(lines) + "\n"


def _q_flow(data: dict[str, object]) -> str:
    """A YAML flow mapping of plain keys and integers / enum words (JSON object syntax is valid YAML)."""
    return json.dumps(data)


def _c(line: str) -> str:
    """A line whose comment cannot end early: every control, line-break or non-ASCII character is escaped (YAML
    also breaks lines at U+0085, U+2028 and U+2029), so text from a config.json or a path stays inside its comment."""
    if line.isascii() and line.isprintable():
        return line
    return "".join(ch if ch.isascii() and ch.isprintable() else json.dumps(ch)[1:-1] for ch in line)


def _comment(text: str) -> str:
    """Text safe inside a YAML comment: one line."""
    return " ".join(str(text).split())


def _q(text: str) -> str:
    """A YAML double-quoted scalar (JSON string syntax is valid YAML)."""
    return json.dumps(text)
