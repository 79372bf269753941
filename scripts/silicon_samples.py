"""Print trtkv's step model beside NVIDIA's measured runs that aiconfigurator-core gates its own accuracy on
(aiconfigurator_core/systems/silicon_sample.csv in the installed package, .venv-aic: `make install-aic`), for one slice:
a model, a system, an engine, ISL/OSL and the expert quantization the rows name. Evidence, not held data (issue #49):
the rows name engine version, GPU, parallelism, lengths and concurrency, but not the KV dtype, speculative decoding or
how the client sent requests, so TTFT (which depends on arrival) is shown but not judged, and KV is taken as FP8.

Rows kept: aggregated serving of one replica (silicon_concurrency = batch_size x attention_dp_size) on one node,
whose parallelism trtkv can state (moe_tp x moe_ep = tp x attention_dp <= 8 GPUs); a measurement the file lists under
two or more parallel layouts is dropped as ambiguous.
Usage: .venv/bin/python scripts/silicon_samples.py [--model gpt-oss-120b] [--config tests/data/configs/gpt_oss_120b]
       [--system b200_sxm] [--backend trtllm] [--isl 1024] [--osl 1024] [--moe-quant nvfp4]"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support import speed_cases as sc  # noqa: E402

GPUS = {system: gpu for gpu, system in sc.GPUS.items()}
ENGINES = {"trtllm": "llmapi", "vllm": "vllm", "sglang": "sglang"}
BAND = 0.25  # issue #49's ITL/TPOT band
NODE = 8  # GPUs of one node: multi-node wide EP is outside trtkv's step model


def sample_file() -> Path:
    found = sorted(ROOT.glob(".venv-aic/lib/python*/site-packages/aiconfigurator_core/systems/silicon_sample.csv"))
    if not found:
        raise SystemExit("no aiconfigurator-core in .venv-aic: run `make install-aic` first")
    return found[0]


def layouts(row: dict[str, str]) -> tuple[int, int, int, int, int]:
    """(concurrency, tp, attention_dp, moe_tp, ep) of one row."""
    conc = re.search(r"silicon_concurrency=(\d+)", row["silicon_data_source"])
    return (int(conc.group(1)) if conc else 0, *(int(float(row[f] or 1)) for f in (
        "tp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size")))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt-oss-120b")
    ap.add_argument("--config", default="tests/data/configs/gpt_oss_120b")
    ap.add_argument("--system", default="b200_sxm", choices=sorted(GPUS))
    ap.add_argument("--backend", default="trtllm", choices=sorted(ENGINES))
    ap.add_argument("--isl", type=int, default=1024)
    ap.add_argument("--osl", type=int, default=1024)
    ap.add_argument("--moe-quant", default="nvfp4", help="the rows' moe_quant_mode (gpt-oss's MXFP4: nvfp4)")
    args = ap.parse_args()
    path = sample_file()
    rows = [r for r in csv.DictReader(path.open()) if r["mode"] == "agg" and r["model_path"].endswith(args.model)
            and r["system"] == args.system and r["backend"] == args.backend and int(r["isl"]) == args.isl
            and int(r["osl"]) == args.osl and r["moe_quant_mode"] == args.moe_quant]
    def figures(r: dict[str, str]) -> tuple[float, float]:
        return round(float(r["silicon_ttft_ms"]), 3), round(float(r["silicon_tpot_ms"]), 3)

    by_figures: dict[tuple[float, float], set[tuple[int, ...]]] = defaultdict(set)
    for r in rows:
        by_figures[figures(r)].add(layouts(r))
    kept: dict[tuple[int, ...], dict[str, str]] = {}
    for r in rows:
        conc, tp, adp, moe_tp, ep = lay = layouts(r)
        one_replica = conc == int(float(r["batch_size"])) * adp and moe_tp * ep == tp * adp <= NODE
        if one_replica and len(by_figures[figures(r)]) == 1:
            kept.setdefault(lay, r)
    print(f"{path.relative_to(ROOT)}: {len(rows)} rows of {args.model} on {args.system} {args.backend} "
          f"{args.isl}/{args.osl} ({args.moe_quant}); {len(kept)} kept (one replica, one layout)")
    print(f"{'tp':>3} {'adp':>3} {'moe_tp':>6} {'ep':>3} {'conc':>5} {'version':<16} {'TPOT':>7} {'trtkv':>7} "
          f"{'error':>7} {'TTFT':>8} {'trtkv':>8}")
    errors = []
    setup = {"model_config": args.config, "backend": ENGINES[args.backend], "weights": "none"}
    for (conc, tp, adp, moe_tp, ep), r in sorted(kept.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0])):
        m = {"gpu": GPUS[args.system], "tp": tp, "ep": ep, "attention_dp": adp, "input_tokens": args.isl,
             "output_tokens": args.osl, "concurrency": conc, "max_num_batched_tokens": 8192, "arrival": "staggered"}
        got = sc.step_model_figures(setup, m, "fp8")
        tpot, ttft = float(r["silicon_tpot_ms"]), float(r["silicon_ttft_ms"])
        errors.append(got["tpot_p50_ms"] / tpot - 1)
        print(f"{tp:>3} {adp:>3} {moe_tp:>6} {ep:>3} {conc:>5} {r['backend_version'] or '?':<16} {tpot:>7.2f} "
              f"{got['tpot_p50_ms']:>7.2f} {errors[-1]:>+7.1%} {ttft:>8.1f} {got['ttft_p50_ms']:>8.1f}")
    if errors:
        inside = sum(abs(e) <= BAND for e in errors)
        print(f"TPOT: {inside} of {len(errors)} within {BAND:.0%}; median error {statistics.median(errors):+.1%}, "
              f"median |error| {statistics.median(abs(e) for e in errors):.1%}. TTFT not judged (arrival unknown).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
