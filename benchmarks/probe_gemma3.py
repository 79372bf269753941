"""`make bench-probe-gemma3`: the window-aware KV probe on Gemma 3 270M to 32K, timed, with its peak RSS.

One pass per format at the longest length serves every shorter length (KL bucketed by position) and asks the
needles: every needle of every (length, depth, seed) sits in that pass's text with its own key (RULER's
niah_multikey), and at each needle length the cache is copied and that length's questions run as short suffixes
(trtkv.probe.needles), so needles cost a few short suffixes per format, for every format. Writes the probe folder
(probe.json, probe.md) and bench.json there: seconds (wall and CPU) per piece, peak RSS, load average, threads.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FORMATS = "fp16,fp8,int8,int8_token,int4_g64,kivi4,nvfp4"
LENGTHS = "4096,8192,16384,32768"
NEEDLES = "8192,16384,32768"
RECIPE = """\
description: Gemma 3 270M (base) for the window-aware KV probe (benchmarks/probe_gemma3.py)
model:
  source: packaged:gemma3
  architecture: gemma3
  max_position_embeddings: 32768
quantization:
  kv_cache: fp8
  kv_scales: static_per_tensor
build:
  backend: reference
  max_seq_len: 32768
  max_input_len: 32000
  max_num_tokens: 32768
hardware:
  gpu: cpu
probe:
  lengths: [4096, 8192, 16384, 32768]
  needle_depths: {depths}
  needle_seeds: {seeds}
"""


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    """Run the two phases and write bench.json beside the probe's outputs."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output", type=Path, default=ROOT / "engines" / "bench-probe-gemma3")
    ap.add_argument("--formats", default=FORMATS)
    ap.add_argument("--lengths", default=LENGTHS)
    ap.add_argument("--needle-lengths", default=NEEDLES, help="empty: no needles")
    ap.add_argument("--needle-depths", default="0.1,0.5,0.9")
    ap.add_argument("--needle-seeds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decode-prompt", type=int, default=1024, help="scale reuse through decode: prompt tokens")
    ap.add_argument("--decode-steps", type=int, default=32, help="scale reuse through decode: steps")
    args = ap.parse_args(argv)

    import torch

    from trtkv.contracts.probe_doc import ProbeDoc
    from trtkv.measures.probe_results import classify
    from trtkv.probe.setup import ProbeSettings
    from trtkv.probe.sweep import run_probe
    from trtkv.recipe import load_recipe

    torch.set_num_threads(args.threads)
    out = args.output.resolve()
    out.mkdir(parents=True, exist_ok=True)
    depths = [float(x) for x in args.needle_depths.split(",") if x]
    recipe_file = out / "gemma3_probe.yaml"
    recipe_file.write_text(RECIPE.format(depths=depths, seeds=args.needle_seeds))
    recipe = load_recipe(recipe_file)
    formats = ["fp16", *[f for f in args.formats.split(",") if f and f != "fp16"]]
    lengths, needle_lengths = _ints(args.lengths), _ints(args.needle_lengths)
    probe_dir = out / "probe"
    bench: dict = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "threads": args.threads,
                   "cpu_count": os.cpu_count(), "load_before": os.getloadavg(), "formats": formats,
                   "lengths": lengths, "needle_lengths": needle_lengths, "needle_depths": depths,
                   "needle_seeds": args.needle_seeds}
    t0, c0 = time.time(), time.process_time()
    settings = ProbeSettings(formats=formats, lengths=lengths, needle_lengths=needle_lengths, needle_depths=depths,
                             needle_seeds=args.needle_seeds, threads=args.threads, progress=sys.stderr.isatty(),
                             decode_prompt=args.decode_prompt, decode_steps=args.decode_steps)
    run_probe(recipe, probe_dir, settings)
    bench["cpu_seconds"] = round(time.process_time() - c0, 1)
    doc = json.loads((probe_dir / "probe.json").read_text())
    longest = max(lengths)
    probe = ProbeDoc.load(probe_dir)
    bench["advised"] = [r.format for r in (probe.records if probe else []) if r.context_len == longest
                        and r.format != "fp16" and classify(r) == "safe"]
    bench["needle_formats"] = formats  # asked from every format's KL pass: a few short suffixes each
    bench["pass_seconds"] = doc.get("pass_seconds")
    bench["total_seconds"] = round(time.time() - t0, 1)
    bench["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    bench["load_after"] = os.getloadavg()
    (out / "bench.json").write_text(json.dumps(bench, indent=2))
    print(json.dumps(bench, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
