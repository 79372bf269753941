"""`trtkv probe`: KV-cache precision vs context length on the recipe's real model."""

from __future__ import annotations

import argparse
from pathlib import Path

from trtkv.cli.common import add_recipe_args, load, subparser
from trtkv.core.errors import TrtkvError

EXAMPLES = """\
  $ trtkv probe smollm2_fp8kv
  $ trtkv probe smollm2_fp8kv --formats fp16,fp8,int8,int8_token,int4_g64 --lengths 512 --output /tmp/probe
  $ trtkv probe smollm2_int8kv --formats int8,int8_split --lengths 1024,4096 --needle-lengths 1024
  $ trtkv probe smollm2_fp8kv probe.needle_seeds=10 --scales engines/smollm2_fp8kv/checkpoint/kv_scales.json
  $ trtkv probe smollm2_fp8kv --formats fp8,int8,int4_g64 --lengths 2048 --ruler --ruler-lengths 2048,4096 --ruler-samples 3
  $ trtkv probe smollm2_fp8kv --ruler-tasks niah_single_1,vt bench.ruler_lengths=[4096]
  $ trtkv probe smollm2_fp8kv --formats fp8,fp8_scale1 --lengths 2048 --attention vllm_fa3_fp8,trtllm_fp8_fmha_sm90
  $ trtkv probe llama70b_fp8kv --lengths 32768 --dry-run
"""


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers, e.g. 512,1024") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers, e.g. 512,1024")
    return values


def _names(text: str) -> list[str]:
    from trtkv.kvcache.quant import all_format_names

    names = [x.strip().lower() for x in text.split(",") if x.strip()]
    allowed = all_format_names()
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown KV format(s) {bad or text!r}. Allowed: {', '.join(allowed)}")
    return names


def _words(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated names, e.g. niah_single_1,vt")
    return names


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = subparser(sub, "probe", EXAMPLES)
    add_recipe_args(p)
    p.add_argument("--formats", type=_names, default=None,
                   help="comma-separated KV formats (default: the recipe's probe.formats; fp16 is the baseline, "
                        "always included)")
    p.add_argument("--lengths", type=_ints, default=None, help="context lengths, e.g. 512,1024 (default probe.lengths)")
    p.add_argument("--needle-lengths", type=_ints, default=None,
                   help="lengths for passkey retrieval (default: the longest sweep length <= 512; with --per-layer: "
                        "none unless given, then for the uniform format, all-16-bit and every verified set)")
    p.add_argument("--no-needle", action="store_true", help="skip passkey retrieval")
    p.add_argument("--decode-steps", type=int, default=None, help="decode steps of the scale-reuse experiment (32)")
    p.add_argument("--scales", type=Path, default=None,
                   help="kv_scales.json for the static formats (default: engines/<recipe>/checkpoint/kv_scales.json "
                        "when present, else a short calibration pass)")
    p.add_argument("--output", type=Path, default=None, help="output folder (default engines/<recipe>/probe)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice, 1 when the machine is busy)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--ruler", action="store_true",
                   help="also answer the bench's RULER items greedily with every format's cache (docs/ruler.md); "
                        "slow on the CPU, so off by default")
    p.add_argument("--ruler-tasks", type=_words, default=None,
                   help="RULER tasks (implies --ruler; default all six: niah_single_1, niah_multikey_2, "
                        "niah_multikey_3, vt, cwe, fwe)")
    p.add_argument("--ruler-lengths", type=_ints, default=None, help="RULER lengths (default bench.ruler_lengths)")
    p.add_argument("--ruler-samples", type=int, default=None,
                   help="RULER items per task and length (default bench.ruler_samples; fewer = the bench's first ones)")
    p.add_argument("--attention", default=None,
                   help="attention numerics besides cache-only: auto (the recipe's engine, flags and GPU), cache_only, "
                        "or engine modes separated by commas (default probe.attention; docs/kv-formats.md lists them)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the device map, memory per device and the passes on the recipe's hardware, from the "
                        "config alone (no weights), and exit (1 when it does not fit)")
    p.add_argument("--per-layer", metavar="FORMAT", default=None,
                   help="per-layer KV precision for FORMAT: each layer's sensitivity, the layers to keep in 16 bit "
                        "(verified), the bytes-vs-KL front (per_layer_<FORMAT>.json/.md/.png)")
    p.add_argument("--max-keep", type=int, default=4, help="--per-layer: largest set of 16-bit layers tried (4)")
    p.add_argument("--max-bytes-per-token", type=float, default=None,
                   help="--per-layer budget: the lowest-KL set within these KV bytes/token (default uniform + 15%%)")
    p.add_argument("--max-kl", type=float, default=None, help="--per-layer budget: the cheapest set with KL <= this")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trtkv.probe.setup import default_settings
    from trtkv.probe.sweep import run_probe

    recipe = load(args)
    if args.per_layer:
        from trtkv.probe.layers import PerLayerOptions, run_per_layer

        run_per_layer(recipe, PerLayerOptions(args.per_layer, args.lengths, max_keep=args.max_keep,
                                              max_bytes_per_token=args.max_bytes_per_token, max_kl=args.max_kl,
                                              threads=args.threads,
                                              needle_lengths=None if args.no_needle else args.needle_lengths),
                      args.output)
        return 0
    if args.dry_run:
        from trtkv.platform.hardware import GPU
        from trtkv.probe.placement import dry_run

        planned = default_settings(recipe, args.formats, args.lengths, args.needle_lengths, args.attention,
                                   cuda=recipe.hardware.gpu is not GPU.CPU)
        if args.no_needle:
            planned.needle_lengths = []
        placement, lines = dry_run(recipe, planned)
        print("\n".join(lines))
        return 0 if placement.fits else 1
    settings = default_settings(recipe, args.formats, args.lengths, args.needle_lengths, args.attention)
    if args.no_needle:
        settings.needle_lengths = []
    if args.decode_steps is not None:
        if args.decode_steps < 1:
            raise TrtkvError(f"--decode-steps {args.decode_steps}: must be >= 1.")
        settings.decode_steps = args.decode_steps
    if args.scales is not None and not args.scales.is_file():
        raise TrtkvError(f"--scales {args.scales}: no such file. Next: run `trtkv calibrate {recipe.name}` or drop "
                         f"--scales to calibrate on the shipped text.")
    if args.ruler or args.ruler_tasks:
        from trtkv.bench.ruler import probe_plan

        settings.ruler = probe_plan(recipe, args.ruler_tasks, args.ruler_lengths, args.ruler_samples)
    elif args.ruler_lengths or args.ruler_samples is not None:
        raise TrtkvError("--ruler-lengths/--ruler-samples without --ruler: RULER is off by default. "
                         "Next: add --ruler (or --ruler-tasks).")
    settings.scales_path = args.scales
    settings.threads = args.threads
    settings.progress = not args.no_progress
    out = run_probe(recipe, args.output, settings)
    print(f"probe: wrote {out / 'probe.json'}, {out / 'probe.md'} and plots")
    _print_summary(out)
    return 0


def _print_summary(out: Path) -> None:
    from trtkv.contracts.artifacts import ProbeDoc
    from trtkv.probe.results import summary_lines

    doc = ProbeDoc.load(out)
    for line in summary_lines(doc.records if doc else []):
        print(line)
    if doc is not None:
        from trtkv.probe.attention_report import summary_lines as attention_lines

        for line in attention_lines(doc.model_dump()):
            print(line)
        from trtkv.probe.ruler import summary_lines as ruler_lines

        for line in ruler_lines(doc.model_dump()):
            print(line)
