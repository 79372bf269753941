"""`trtkv init`: write a commented recipe from a model's config.json that validates and plans at
once."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from pydantic import Field, field_validator

from trtkv.checkpoints.render import DECODERS, DEFAULT_SEQ_LEN
from trtkv.cli.common import add_verb
from trtkv.core.errors import RecipeError
from trtkv.core.options import Flag, Options
from trtkv.platform.gpu_names import gpu_from_name, known_gpus
from trtkv.platform.hardware import GPU
from trtkv.recipe import Backend, KVCacheQuant, WeightQuant
from trtkv.recipe.settle import Settings

if TYPE_CHECKING:
    from collections.abc import Callable

    from trtkv.checkpoints import ModelFacts
    from trtkv.recipe import Recipe

# GPUs tried when --count is not given: TP within a node, then PP over nodes
COUNTS = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_GPU = GPU.H100_80GB
# max_batch_size re-sized to what fits with itself as the engine's max_num_seqs (1 round in
# practice)
SETTLE_ROUNDS = 4


class InitOptions(Options):
    """`trtkv init NAME --model PATH [options]`: each field one argument (trtkv.core.options)."""

    name: Annotated[
        str,
        Field(description="recipe name: lower-case letters, digits, '_' and '-'"),
        Flag(names=("name",)),
    ]
    model: Annotated[
        Path, Field(description="model folder holding config.json, or the config.json"), Flag()
    ]
    output: Annotated[
        Path | None, Field(description="recipe file to write (default recipes/NAME.yaml)"), Flag()
    ] = None
    gpu: Annotated[
        str,
        Field(
            description=f"target GPU, as trtkv names it or as nvidia-smi prints it (e.g. 'NVIDIA "
            f"H100 80GB HBM3'): {known_gpus()}"
        ),
        Flag(metavar="GPU"),
    ] = DEFAULT_GPU.value
    count: Annotated[
        int | None,
        Field(
            description="GPUs per model instance (default: the fewest that hold the weights and "
            "one sequence of max_seq_len)"
        ),
        Flag(),
    ] = None
    kv_cache: Annotated[
        KVCacheQuant | None,
        Field(
            description="KV-cache precision (default fp8 where the GPU has FP8, else none; "
            "fp8_cast, with a warning, where the engine reads no KV scale beside a pre-quantized "
            "checkpoint's weights)"
        ),
        Flag(),
    ] = None
    backend: Annotated[
        Backend | None,
        Field(
            description=f"engine (default {Backend.LLMAPI.value} on a GPU; on {GPU.CPU.value} "
            f"{Backend.REFERENCE.value} for Llama-family models, else {Backend.VLLM.value})"
        ),
        Flag(),
    ] = None
    weights: Annotated[
        WeightQuant | None,
        Field(
            description="weight quantization (default none: the checkpoint's weights as stored, a "
            "pre-quantized checkpoint never quantized again; a format is refused on one unless it "
            "is smaller)"
        ),
        Flag(),
    ] = None
    max_seq_len: Annotated[
        int | None,
        Field(
            ge=1,
            description="prompt + answer tokens (default the model's max_position_embeddings, at "
            f"most {DEFAULT_SEQ_LEN}); max_input_len is 7/8 of it",
        ),
        Flag(metavar="TOKENS"),
    ] = None
    concurrency: Annotated[
        int | None,
        Field(
            ge=1,
            description="requests served at once: max_batch_size (vLLM's max_num_seqs), and "
            "--count grows until N sequences of max_seq_len fit (default: the sequences of the "
            "bench workload, 2,048 in + 256 out tokens, that fit on the fewest GPUs holding one of "
            "max_seq_len, at most the engine's own default)",
        ),
        Flag(metavar="N"),
    ] = None
    force: Annotated[bool, Field(description="overwrite an existing recipe file"), Flag()] = False

    @field_validator("gpu")
    @classmethod
    def _any_gpu_name(cls, value: str) -> str:
        """trtkv's name, nvidia-smi's or GPU feature discovery's, as trtkv's value."""
        gpu = gpu_from_name(value)
        if gpu is None:
            raise ValueError(
                f"unknown GPU: use one of {known_gpus()} (or its name as nvidia-smi prints it); "
                "for another GPU pick the nearest and set hardware.memory_gib in the recipe"
            )
        return gpu.value


def add_parser(sub: argparse._SubParsersAction) -> None:
    examples = (
        "  $ trtkv init gemma3_27b_fp8kv --model ~/models/gemma-3-27b-it\n"
        "  $ trtkv init dsv3_fp8kv --model config.json --gpu H200-141GB --count 8\n"
        "  $ trtkv init scout --model DIR --output /tmp/scout.yaml --backend vllm && trtkv plan "
        "/tmp/scout.yaml\n"
    )
    add_verb(sub, "init", examples, InitOptions, run, recipe=None, overrides=None)


def run(args: argparse.Namespace) -> int:
    o = InitOptions.from_args(args)
    out = write_recipe(
        o.name,
        o.model,
        o.output,
        o.gpu,
        o.count,
        o.kv_cache.value if o.kv_cache else None,
        o.backend.value if o.backend else None,
        o.force,
        weights=o.weights.value if o.weights else None,
        max_seq_len=o.max_seq_len,
        concurrency=o.concurrency,
    )
    print(f"wrote {out}\nNext: trtkv plan {out}")
    return 0


def write_recipe(
    name: str,
    model: Path,
    output: Path | None = None,
    gpu: str = DEFAULT_GPU.value,
    count: int | None = None,
    kv_cache: str | None = None,
    backend: str | None = None,
    force: bool = False,
    *,
    weights: str | None = None,
    max_seq_len: int | None = None,
    concurrency: int | None = None,
    warn: Callable[[str], None] | None = None,
) -> Path:
    """Read the config, size TP/PP and the batch with the planner, write the recipe atomically once
    its engine accepts it (trtkv.recipe.settle) and it plans; the text is
    trtkv.checkpoints.render's. A format init moved off its default is said through `warn`
    (stderr by default)."""
    from trtkv.checkpoints import config_file, declared_kv_algo, read_model_facts
    from trtkv.platform.hardware import GPU_SPECS

    out = _checked_output(
        name, output, force, count=count, max_seq_len=max_seq_len, concurrency=concurrency
    )
    facts = read_model_facts(model.expanduser())
    target = gpu_from_name(gpu) or GPU(gpu)  # GPU(): ValueError naming the unknown value
    on_cpu = target is GPU.CPU
    kv = kv_cache or ("fp8" if on_cpu or GPU_SPECS[target].has_fp8 else "none")
    llama = DECODERS.get(facts.model_type) == "llama"
    from trtkv.backends import BACKENDS, default_backend

    chosen = backend or default_backend(on_cpu=on_cpu, llama_family=llama).value  # as --help says
    source = config_file(model.expanduser()).resolve().parent
    mpe = facts.max_position_embeddings or DEFAULT_SEQ_LEN
    given = {
        flag: str(value)
        for flag, value in (
            ("--gpu", target.value),
            ("--count", count),
            ("--kv-cache", kv_cache),
            ("--backend", backend),
            ("--weights", weights),
            ("--max-seq-len", max_seq_len),
            ("--concurrency", concurrency),
        )
        if value is not None
    }
    first = Settings(
        target.value,
        0,
        kv,
        weights or "none",
        chosen,
        max_seq_len or min(mpe, DEFAULT_SEQ_LEN),
        concurrency or 1,
    )
    declared = declared_kv_algo(source, facts.quant.kv_cache if facts.quant else None)
    first.checkpoint_kv = (declared, str(source))
    memory = BACKENDS[Backend(chosen)].memory  # the options' Backend type checked `chosen`
    if memory is not None and memory.default_step is not None and not on_cpu:
        first.num_tokens, first.why["build.max_num_tokens"] = memory.default_step(target)
    text, settled = _sized_text(
        name,
        out,
        facts,
        _renderer(name, facts, source),
        first,
        given,
        count=count,
        concurrency=concurrency,
    )
    _write_new(out, text, force)
    from trtkv.recipe import MOVED_FORMATS

    for where in MOVED_FORMATS:
        if where in settled.why:
            (warn or _stderr)(f"warning: {out}: {where}: {settled.why[where]}")
    return out


def _stderr(line: str) -> None:
    import sys

    print(line, file=sys.stderr)


def _checked_output(name: str, output: Path | None, force: bool, **sizes: int | None) -> Path:
    """The recipe file to write, refused before any work: a bad name, an --output whose name is not
    NAME, a size flag out of its range, or an existing file without --force."""
    from trtkv.core import paths
    from trtkv.recipe.limits import RANGES
    from trtkv.recipe.names import check_recipe_name

    out = (output or paths.recipes_dir() / f"{name}.yaml").expanduser()
    check_recipe_name(name, out)
    if output is not None and out.stem != name:
        raise _not_written(
            f"--output {out}: a recipe's name is its file name; {out.stem!r} is not {name!r}. "
            f"Next: --output {out.with_name(name + '.yaml')}"
        )
    for flag, value, bound in (
        ("--count", sizes["count"], RANGES["gpus"]),
        ("--max-seq-len", sizes["max_seq_len"], RANGES["positions"]),
        ("--concurrency", sizes["concurrency"], RANGES["batch"]),
    ):
        if value is not None and not bound.admits(value):
            raise _not_written(
                f"{flag} {value}: must be in {bound.text()}. Next: leave it out to size it from "
                "the model."
            )
    if out.exists() and not force:
        raise _not_written(
            f"{out}: already exists; trtkv init never replaces a recipe. Next: pick another NAME "
            "or --output, or pass --force to overwrite it."
        )
    return out


def _not_written(problem: str) -> RecipeError:
    return RecipeError([problem], header="Recipe not written")


def _sized_text(
    name: str,
    out: Path,
    facts: ModelFacts,
    draw: Callable[[Settings], str],
    first: Settings,
    given: dict[str, str],
    *,
    count: int | None,
    concurrency: int | None,
) -> tuple[str, Settings]:
    """The recipe text and its settings on the fewest GPUs (--count, else COUNTS in turn; one on
    the CPU) that hold the weights and `concurrency` sequences of max_seq_len, with max_batch_size
    set to the sequences of the bench workload that fit there, at most the engine's own default
    (trtkv.recipe.settle.batch_for, trtkv.plan.concurrency)."""
    from trtkv.recipe.settle import batch_for, propose_wide_ep, refusal, settle

    on_cpu = first.gpu == GPU.CPU.value
    need = first.batch
    tried: list[str] = []
    for n in [count] if count is not None else [1] if on_cpu else list(COUNTS):
        s = replace(first, count=n, why=dict(first.why))
        s.num_tokens = max(s.num_tokens, need)
        text, recipe = settle(name, out, s, given, draw)
        fits, why, work = _fits(recipe)
        if fits >= need or on_cpu:
            break
        tried.append(f"{n} x {first.gpu}: {why}")
        if count is not None:
            raise refusal(
                out,
                [
                    (
                        "build.max_batch_size" if fits else "hardware.count",
                        f"{why}, and {need} sequence(s) of max_seq_len {s.seq_len} are asked for: "
                        "a larger GPU (--gpu), more GPUs (--count), a shorter --max-seq-len, a "
                        "smaller --kv-cache or a lower --concurrency (more replicas: `trtkv deploy "
                        "--target-concurrency`)",
                    )
                ],
                given,
            )
    else:
        raise _not_written(
            f"{facts.path}: no count in {COUNTS} of {first.gpu} holds the weights and {need} "
            f"sequence(s) of max_seq_len ({'; '.join(tried)}). Next: a larger GPU (--gpu), "
            "--count N, --kv-cache fp8, or a shorter --max-seq-len."
        )
    if facts.moe is not None and not on_cpu:
        wide = propose_wide_ep(name, out, s, given, draw, recipe, fits, lambda r: _fits(r)[:2])
        if wide != fits:  # the wide layout taken: its recipe and workload from here
            text, recipe = settle(name, out, s, given, draw)
            fits, _why, work = _fits(recipe)
    s.batch, s.why["build.max_batch_size"] = batch_for(fits, concurrency, on_cpu, *work)
    # the engine's own reserve grows with the cap (vLLM's sampler rows and CUDA graphs, the
    # TensorRT-LLM warm-up's logits): re-planned with the cap until the workload fits beside it
    for _ in range(SETTLE_ROUNDS):
        if s.batch == need:
            break
        s.num_tokens = max(s.num_tokens, s.batch)
        text, recipe = settle(name, out, s, given, draw)
        fits, _why, work = _fits(recipe)
        if concurrency is not None or on_cpu or work[0][2] >= s.batch:
            break
        s.batch, s.why["build.max_batch_size"] = batch_for(fits, concurrency, on_cpu, *work)
    else:  # settled on the last round's batch: its recipe
        text, recipe = settle(name, out, s, given, draw)
    return text, s


def _write_new(out: Path, text: str, force: bool) -> None:
    """Write `out` atomically (a temporary sibling put in place); without `force` never over a file
    that appeared meanwhile."""
    from trtkv.core import paths
    from trtkv.core.files import naming

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = paths.temp_sibling(out, "tmp")
    try:
        with naming(tmp):
            tmp.write_text(text, encoding="utf-8")
        if force:
            tmp.replace(out)
        # a hard link never replaces: of two concurrent runs exactly one writes, the other is
        # refused
        else:
            _link_new(tmp, out, text)
    except FileExistsError:
        raise _not_written(
            f"{out}: already exists (written meanwhile by another run?); trtkv init never replaces "
            "a recipe. Next: pick another NAME or --output, or pass --force to overwrite it."
        ) from None
    finally:
        tmp.unlink(missing_ok=True)


def _link_new(tmp: Path, out: Path, text: str) -> None:
    """Put `tmp` in place as `out` only if `out` does not exist (FileExistsError otherwise); where
    the file system has no hard links, an exclusive create (O_EXCL) written in one go."""
    try:
        os.link(tmp, out)
    except FileExistsError:
        raise
    except OSError:  # no hard links here (FAT, some network mounts)
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)


def _fits(
    recipe: Recipe,
) -> tuple[int, str, tuple[tuple[int, int, int], tuple[int, str] | None]]:
    """Sequences of max_seq_len the recipe's KV format fits per replica (trtkv plan), the figures
    in words, and the workload's (in tokens, out tokens, sequences that fit) with the engine's own
    limit (sequences, its flag; None where it has none)."""
    from trtkv.plan.planner import plan

    p = plan(recipe)
    cap = next(c for c in p.formats if c.format == p.recipe_kv_format)
    fits = cap.max_sequences.get(recipe.build.max_seq_len, 0)
    c = p.concurrency
    limit = None if c.engine_limit is None else (c.engine_limit, c.flag)
    return (
        fits,
        (
            f"{p.weights.per_gpu_gib:.0f} GiB of weights per GPU leave "
            f"{p.kv_budget_gib_per_gpu:.1f} GiB for KV: {fits} sequence(s) of "
            f"{recipe.build.max_seq_len} tokens in {p.recipe_kv_format}"
        ),
        ((c.input_tokens, c.output_tokens, c.workload_sequences), limit),
    )


def _renderer(name: str, facts: ModelFacts, source: Path) -> Callable[[Settings], str]:
    """The recipe text for each attempt's settings (trtkv.checkpoints.render), the parameters
    counted once."""
    from trtkv.checkpoints import count_parameters, stored_weight_bytes
    from trtkv.checkpoints.render import render

    params = count_parameters(facts)
    stored = stored_weight_bytes(facts, params, 2.0)
    return lambda s: render(name, facts, source, s, params=params, stored=stored)
