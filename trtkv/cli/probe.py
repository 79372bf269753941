"""`trtkv probe`: KV-cache precision vs context length on the recipe's real model."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from trtkv.cli.common import add_verb, load
from trtkv.core.errors import TrtkvError
from trtkv.core.options import Flag, Options

if TYPE_CHECKING:
    from trtkv.probe.layers import PerLayerOptions
    from trtkv.probe.setup import ProbeSettings
    from trtkv.recipe import Recipe

EXAMPLES = """\
  $ trtkv probe smollm2_fp8kv
  $ trtkv probe smollm2_fp8kv --formats fp16,fp8,int8,int8_token,int4_g64 --lengths 512 --output /tmp/probe
  $ trtkv probe smollm2_int8kv --formats int8,int8_split --lengths 1024,4096 --needle-lengths 1024
  $ trtkv probe smollm2_fp8kv probe.needle_seeds=10 --scales engines/smollm2_fp8kv/checkpoint/kv_scales.json
  $ trtkv probe smollm2_fp8kv --formats fp8,int8,int4_g64 --lengths 2048 --ruler --ruler-lengths 2048,4096 --ruler-samples 3
  $ trtkv probe smollm2_fp8kv --ruler-tasks niah_single_1,vt bench.ruler_lengths=[4096]
  $ trtkv probe smollm2_fp8kv --formats fp8,fp8_scale1 --lengths 2048 --attention vllm_fa3_fp8,trtllm_fp8_fmha_sm90
  $ trtkv probe llama70b_fp8kv --lengths 32768 --dry-run
"""  # noqa: E501


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected comma-separated integers, e.g. 512,1024"
        ) from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers, e.g. 512,1024")
    return values


def _names(text: str) -> list[str]:
    from trtkv.kvcache.names import all_format_names

    names = [x.strip().lower() for x in text.split(",") if x.strip()]
    allowed = all_format_names()
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown KV format(s) {bad or text!r}. Allowed: {', '.join(allowed)}"
        )
    return names


def _words(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected comma-separated names, e.g. niah_single_1,vt"
        )
    return names


class ProbeOptions(Options):
    """`trtkv probe RECIPE [options]`: each field one flag (trtkv.core.options); the comma lists are
    parsed by argparse (`_ints`, `_names`, `_words`), so a bad one is reported as argparse reports
    it."""

    formats: Annotated[
        list[str] | None,
        Field(
            description="comma-separated KV formats (default: the recipe's probe.formats; fp16 is "
            "the baseline, always included)"
        ),
        Flag(parse=_names),
    ] = None
    lengths: Annotated[
        list[int] | None,
        Field(description="context lengths, e.g. 512,1024 (default probe.lengths)"),
        Flag(parse=_ints),
    ] = None
    needle_lengths: Annotated[
        list[int] | None,
        Field(
            description="lengths for passkey retrieval (default: the longest sweep length <= 512; "
            "with --per-layer: none unless given, then for the uniform format, all-16-bit and "
            "every verified set)"
        ),
        Flag(parse=_ints),
    ] = None
    no_needle: Annotated[bool, Field(description="skip passkey retrieval"), Flag()] = False
    decode_steps: Annotated[
        int | None, Field(description="decode steps of the scale-reuse experiment (32)"), Flag()
    ] = None
    scales: Annotated[
        Path | None,
        Field(
            description="kv_scales.json for the static formats (default: "
            "engines/<recipe>/checkpoint/kv_scales.json when present, else a short calibration "
            "pass)"
        ),
        Flag(),
    ] = None
    output: Annotated[
        Path | None, Field(description="output folder (default engines/<recipe>/probe)"), Flag()
    ] = None
    threads: Annotated[
        int | None,
        Field(
            description="torch CPU threads (default: torch's choice, 1 when the machine is busy)"
        ),
        Flag(),
    ] = None
    no_progress: Annotated[bool, Field(description="no progress bar"), Flag()] = False
    ruler: Annotated[
        bool,
        Field(
            description="also answer the bench's RULER items greedily with every format's cache "
            "(docs/ruler.md); slow on the CPU, so off by default"
        ),
        Flag(),
    ] = False
    ruler_tasks: Annotated[
        list[str] | None,
        Field(
            description="RULER tasks (implies --ruler; default all six: niah_single_1, "
            "niah_multikey_2, niah_multikey_3, vt, cwe, fwe)"
        ),
        Flag(parse=_words),
    ] = None
    ruler_lengths: Annotated[
        list[int] | None,
        Field(description="RULER lengths (default bench.ruler_lengths)"),
        Flag(parse=_ints),
    ] = None
    ruler_samples: Annotated[
        int | None,
        Field(
            description="RULER items per task and length (default bench.ruler_samples; fewer = the "
            "bench's first ones)"
        ),
        Flag(),
    ] = None
    attention: Annotated[
        str | None,
        Field(
            description="attention numerics besides cache-only: auto (the recipe's engine, flags "
            "and GPU), cache_only, or engine modes separated by commas (default probe.attention; "
            "docs/kv-formats.md lists them)"
        ),
        Flag(),
    ] = None
    dry_run: Annotated[
        bool,
        Field(
            description="print the device map, memory per device and the passes on the recipe's "
            "hardware, from the config alone (no weights), and exit (1 when it does not fit)"
        ),
        Flag(),
    ] = False
    per_layer: Annotated[
        str | None,
        Field(
            description="per-layer KV precision for FORMAT: each layer's sensitivity, the layers "
            "to keep in 16 bit (verified), the bytes-vs-KL front (per_layer_<FORMAT>.json/.md/.png)"
        ),
        Flag(metavar="FORMAT"),
    ] = None
    max_keep: Annotated[
        int, Field(description="--per-layer: largest set of 16-bit layers tried (4)"), Flag()
    ] = 4
    max_bytes_per_token: Annotated[
        float | None,
        Field(
            description="--per-layer budget: the lowest-KL set within these KV bytes/token "
            "(default uniform + 15%%)"
        ),
        Flag(),
    ] = None
    max_kl: Annotated[
        float | None,
        Field(description="--per-layer budget: the cheapest set with KL <= this"),
        Flag(),
    ] = None

    def per_layer_options(self) -> PerLayerOptions:
        """--per-layer's settings (trtkv.probe.layers)."""
        from trtkv.probe.layers import PerLayerOptions

        return PerLayerOptions(
            self.per_layer or "",
            self.lengths,
            max_keep=self.max_keep,
            max_bytes_per_token=self.max_bytes_per_token,
            max_kl=self.max_kl,
            threads=self.threads,
            needle_lengths=None if self.no_needle else self.needle_lengths,
        )


def add_parser(sub: argparse._SubParsersAction) -> None:
    add_verb(sub, "probe", EXAMPLES, ProbeOptions, run)


def run(args: argparse.Namespace) -> int:
    from trtkv.probe.sweep import run_probe

    o = ProbeOptions.from_args(args)
    recipe = load(args)
    if o.per_layer:
        from trtkv.probe.layers import run_per_layer

        run_per_layer(recipe, o.per_layer_options(), o.output)
        return 0
    from trtkv.kvcache.attention_modes import format_modes

    if o.dry_run:
        from trtkv.platform.hardware import GPU
        from trtkv.probe.placement import dry_run
        from trtkv.probe.setup import default_settings

        planned = default_settings(
            recipe,
            o.formats,
            o.lengths,
            o.needle_lengths,
            o.attention,
            cuda=recipe.hardware.gpu is not GPU.CPU,
        )
        if o.no_needle:
            planned.needle_lengths = []
        placement, lines = dry_run(recipe, planned)
        print("\n".join([*format_modes(planned.attention, planned.formats), *lines]))
        return 0 if placement.fits else 1
    settings = _sweep_settings(recipe, o)
    for line in format_modes(settings.attention, settings.formats):
        print(line)
    out = run_probe(recipe, o.output, settings)
    print(f"probe: wrote {out / 'probe.json'}, {out / 'probe.md'} and plots")
    _print_summary(out)
    return 0


def _sweep_settings(recipe: Recipe, o: ProbeOptions) -> ProbeSettings:
    """The sweep's settings: the recipe's probe section with the flags over it, each flag checked
    against the others (a --decode-steps below 1, a --scales file that is not there, RULER lengths
    without --ruler)."""
    from trtkv.probe.setup import default_settings

    settings = default_settings(recipe, o.formats, o.lengths, o.needle_lengths, o.attention)
    if o.no_needle:
        settings.needle_lengths = []
    if o.decode_steps is not None:
        if o.decode_steps < 1:
            raise TrtkvError(f"--decode-steps {o.decode_steps}: must be >= 1.")
        settings.decode_steps = o.decode_steps
    if o.scales is not None and not o.scales.is_file():
        raise TrtkvError(
            f"--scales {o.scales}: no such file. Next: run `trtkv calibrate {recipe.name}` or drop "
            f"--scales to calibrate on the shipped text."
        )
    if o.ruler or o.ruler_tasks:
        from trtkv.bench.tasks.ruler import probe_plan

        settings.ruler = probe_plan(recipe, o.ruler_tasks, o.ruler_lengths, o.ruler_samples)
    elif o.ruler_lengths or o.ruler_samples is not None:
        raise TrtkvError(
            "--ruler-lengths/--ruler-samples without --ruler: RULER is off by default. "
            "Next: add --ruler (or --ruler-tasks)."
        )
    settings.scales_path = o.scales
    settings.threads = o.threads
    settings.progress = not o.no_progress
    return settings


def _print_summary(out: Path) -> None:
    from trtkv.contracts.probe_doc import ProbeDoc
    from trtkv.measures.probe_results import summary_lines

    doc = ProbeDoc.load(out)
    for line in summary_lines(doc.records if doc else []):
        print(line)
    if doc is not None:
        from trtkv.measures.probe_attention import summary_lines as attention_lines

        for line in attention_lines(doc):
            print(line)
        from trtkv.probe.ruler import summary_lines as ruler_lines

        for line in ruler_lines(doc):
            print(line)
