"""`make bench-probe-gemma3-layers`: per-layer KV precision on Gemma 3 270M, timed, with its peak RSS.

For each format, `trtkv probe --per-layer` (trtkv.probe.layers) on the window-aware path: every layer's sensitivity
at the sweep length (only it quantized / all but it), the greedy sets, and the explicit comparison verified by one
pass at the longest length each: uniform, the 15 sliding layers kept in bf16 (`quantization.kv_skip_layers:
[sliding_window]`, vLLM's `--kv-cache-dtype-skip-layers sliding_window`), the 3 full-attention layers kept, and all
bf16; the needles ride in those passes. Writes per_layer_<format>.json/.md/.png and bench.json (wall and CPU seconds
per format and in all, peak RSS, load average, threads) into --output.
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

RECIPE = """\
description: Gemma 3 270M (base) for the per-layer KV probe (benchmarks/probe_gemma3_layers.py)
model:
  source: packaged:gemma3
  architecture: gemma3
  dtype: bfloat16
  num_layers: 18
  num_kv_heads: 1
  head_dim: 256
  max_position_embeddings: 32768
  attention_layers: [sliding:512*5, full, sliding:512*5, full, sliding:512*5, full]
quantization:
  kv_cache: fp8
  kv_scales: static_per_tensor
build:
  backend: vllm
  max_seq_len: 32768
  max_input_len: 32000
  max_num_tokens: 8192
hardware:
  gpu: cpu
probe:
  lengths: {lengths}
  needle_depths: {depths}
  needle_seeds: {seeds}
"""


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    """Run the per-layer analysis for each format and write bench.json beside its outputs."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output", type=Path, default=ROOT / "engines" / "bench-probe-gemma3-layers")
    ap.add_argument("--formats", default="fp8,int8")
    ap.add_argument("--lengths", default="2048,4096,8192", help="the longest: the verification passes' length")
    ap.add_argument("--sweep-length", type=int, default=2048, help="the sensitivity passes' length")
    ap.add_argument("--sensitivity-rows", type=int, default=256, help="LM-head rows per sensitivity pass")
    ap.add_argument("--max-keep", type=int, default=2, help="largest greedy set verified")
    ap.add_argument("--needle-lengths", default="1024,8192", help="empty: no needles")
    ap.add_argument("--needle-depths", default="0.1,0.5,0.9")
    ap.add_argument("--needle-seeds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    import torch

    from trtkv.probe import layers
    from trtkv.recipe import load_recipe

    torch.set_num_threads(args.threads)
    layers.SENSITIVITY_ROWS = args.sensitivity_rows
    out = args.output.resolve()
    out.mkdir(parents=True, exist_ok=True)
    lengths, needle_lengths = _ints(args.lengths), _ints(args.needle_lengths)
    depths = [float(x) for x in args.needle_depths.split(",") if x]
    recipe_file = out / "gemma3_layers.yaml"
    recipe_file.write_text(RECIPE.format(lengths=lengths, depths=depths, seeds=args.needle_seeds))
    recipe = load_recipe(recipe_file)
    bench: dict = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "threads": args.threads,
                   "cpu_count": os.cpu_count(), "load_before": os.getloadavg(), "lengths": lengths,
                   "sweep_length": args.sweep_length, "sensitivity_rows": args.sensitivity_rows,
                   "max_keep": args.max_keep, "needle_lengths": needle_lengths, "formats": {}}
    t0, c0 = time.time(), time.process_time()
    for fmt in [f for f in args.formats.split(",") if f]:
        t1, c1 = time.time(), time.process_time()
        opts = layers.PerLayerOptions(fmt, lengths, max_keep=args.max_keep, threads=args.threads,
                                      needle_lengths=needle_lengths or None, sweep_length=args.sweep_length)
        path = layers.run_per_layer(recipe, opts, out / "probe")
        doc = json.loads(path.read_text())
        by = {p["label"]: p for p in doc["points"]}
        bench["formats"][fmt] = {
            "seconds": round(time.time() - t1, 1), "cpu_seconds": round(time.process_time() - c1, 1),
            "passes": doc["passes"], "order_by_gain": doc["order_by_gain"],
            "recommended": (doc.get("recommended") or {}).get("label"),
            "compare": {label: {k: by[label].get(k) for k in ("bytes_per_token", "kl_by_length", "top1_by_length",
                                                              "needle")}
                        for label in (doc["uniform"]["label"], *(p["label"] for p in doc["sets"].values()),
                                      doc["all_16bit"]["label"])}}
    bench["total_seconds"] = round(time.time() - t0, 1)
    bench["cpu_seconds"] = round(time.process_time() - c0, 1)
    bench["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    bench["load_after"] = os.getloadavg()
    (out / "bench.json").write_text(json.dumps(bench, indent=2))
    print(json.dumps(bench, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
