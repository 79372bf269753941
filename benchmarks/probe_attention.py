"""`make bench-probe-attention`: cache-only vs the engines' attention numerics (FP8 Q and P per KV tile) per format and
length on SmolLM2-135M or Gemma 3 270M, with the prefill-vs-decode drift, timed.

    python benchmarks/probe_attention.py --model smollm2 --lengths 512,2048,4096
    python benchmarks/probe_attention.py --model gemma3 --lengths 4096,8192

Each format is measured cache-only and under every mode that reads it as its engine stores it (vLLM/SGLang FA3 and
FlashInfer: fp8 with amax/448 scales or fp8_scale1; TensorRT-LLM: fp8_scale1, its clamped scale), one pass at the
longest length; no needles (they would ride in Gemma's KL text; this benchmark compares the attention numerics).
Writes the probe folder (probe.json with records, attention_records and drift; probe.md side by side) and bench.json
(seconds, CPU seconds per pass, peak RSS, load average).
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
sys.path.insert(0, str(ROOT / "benchmarks"))

MODES = "vllm_fa3_fp8,vllm_flashinfer_sm90_fp8,trtllm_fp8_fmha_sm90"


def _recipe(model: str, out: Path):  # noqa: ANN202
    from trtkv.recipe import load_recipe

    if model == "smollm2":
        return load_recipe("smollm2_fp8kv", ["calibration.num_samples=16", "calibration.seq_len=256"])
    from probe_gemma3 import RECIPE

    path = out / "gemma3_probe.yaml"
    path.write_text(RECIPE.format(depths=[0.5], seeds=1))
    return load_recipe(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["smollm2", "gemma3"], default="smollm2")
    ap.add_argument("--output", type=Path, default=None, help="default engines/bench-probe-attention-<model>")
    ap.add_argument("--formats", default="fp8,fp8_scale1")
    ap.add_argument("--lengths", default=None, help="default 512,2048,4096 (SmolLM2), 4096,8192 (Gemma 3)")
    ap.add_argument("--attention", default=MODES)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decode-prompt", type=int, default=1024)
    ap.add_argument("--decode-steps", type=int, default=32)
    args = ap.parse_args(argv)

    import torch

    from trtkv.probe.setup import default_settings
    from trtkv.probe.sweep import run_probe

    torch.set_num_threads(args.threads)
    out = (args.output or ROOT / "engines" / f"bench-probe-attention-{args.model}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    recipe = _recipe(args.model, out)
    lengths = [int(x) for x in (args.lengths or ("512,2048,4096" if args.model == "smollm2" else "4096,8192"))
               .split(",")]
    settings = default_settings(recipe, args.formats.split(","), lengths, [], "cache_only," + args.attention,
                                cuda=False)
    settings.needle_lengths = []
    settings.threads, settings.progress = args.threads, sys.stderr.isatty()
    settings.decode_prompt, settings.decode_steps = args.decode_prompt, args.decode_steps
    bench: dict = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "threads": args.threads,
                   "load_before": os.getloadavg(), "formats": settings.formats, "lengths": lengths,
                   "attention": settings.attention}
    t0, c0 = time.time(), time.process_time()
    run_probe(recipe, out / "probe", settings)
    doc = json.loads((out / "probe" / "probe.json").read_text())
    bench.update(total_seconds=round(time.time() - t0, 1), cpu_seconds=round(time.process_time() - c0, 1),
                 pass_seconds=doc.get("pass_seconds"), load_after=os.getloadavg(),
                 peak_rss_gib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2))
    (out / "bench.json").write_text(json.dumps(bench, indent=2))
    print(json.dumps(bench, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
