"""Print trtkv's TPOT beside NVIDIA's measured runs in aiconfigurator-core's systems/silicon_sample.csv for one slice
(a model, a system, an engine, ISL/OSL and the expert quantization the rows name), or with --extract write the rows of
tests/support/silicon.SLICES to tests/data/silicon_samples/ (issue #49; evidence, not held: tests/support/silicon.py).
Reads the installed package's file (.venv-aic: `make install-aiconfigurator`) unless --csv names another.
Usage: .venv/bin/python scripts/silicon_samples.py [--model gpt-oss-120b] [--config tests/data/configs/gpt_oss_120b]
       [--system b200_sxm] [--backend trtllm] [--isl 1024] [--osl 1024] [--moe-quant nvfp4] [--moe-activations mxfp8]
       [--csv PATH] [--extract]"""

from __future__ import annotations

import argparse
import csv
import hashlib
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support import silicon  # noqa: E402

BAND = 0.25  # issue #49's ITL/TPOT band


def installed() -> Path:
    found = sorted(ROOT.glob(".venv-aic/lib/python*/site-packages/aiconfigurator_core/systems/silicon_sample.csv"))
    if not found:
        raise SystemExit("no aiconfigurator-core in .venv-aic: run `make install-aiconfigurator` first, or pass --csv")
    return found[0]


def extract(path: Path) -> int:
    """Write every row of the SLICES, verbatim and in the file's order, with the file's SHA-256 in the README."""
    rows = silicon.read(path)
    mine = [r for r in rows if any(silicon.in_slice(r, s) for s in silicon.SLICES)]
    silicon.SUBSET.parent.mkdir(parents=True, exist_ok=True)
    with silicon.SUBSET.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(mine)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    print(f"{silicon.SUBSET.relative_to(ROOT)}: {len(mine)} of {len(rows)} rows of {path.name} (sha256 {digest})")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", default="gpt-oss-120b")
    ap.add_argument("--config", default=silicon.GPT_OSS)
    ap.add_argument("--system", default="b200_sxm", choices=sorted(silicon.GPUS))
    ap.add_argument("--backend", default="trtllm", choices=sorted(silicon.ENGINES))
    ap.add_argument("--isl", type=int, default=1024)
    ap.add_argument("--osl", type=int, default=1024)
    ap.add_argument("--moe-quant", default="nvfp4", help="the rows' moe_quant_mode (gpt-oss's MXFP4: nvfp4)")
    ap.add_argument("--moe-activations", choices=("auto", "bf16", "mxfp8"), default="auto",
                    help="MXFP4 experts' activations as the runs set them (build.moe_activations; auto: the "
                         "engine's own)")
    ap.add_argument("--csv", type=Path, help="a silicon_sample.csv (default: the installed package's)")
    ap.add_argument("--extract", action="store_true", help="write the slices' rows to tests/data/silicon_samples/")
    args = ap.parse_args()
    path = args.csv or installed()
    if args.extract:
        return extract(path)
    s = silicon.Slice(args.model, args.config, args.system, args.backend, args.moe_quant, args.isl, args.osl,
                      args.moe_activations)
    rows = silicon.read(path)
    got = silicon.comparisons(rows, s)
    print(f"{path}: {sum(silicon.in_slice(r, s) for r in rows)} rows of {s.model} on {s.system} {s.backend} "
          f"{s.isl}/{s.osl} ({s.moe_quant}); {len(got)} kept (one replica on one node, one layout)")
    print(f"{'tp':>3} {'adp':>3} {'moe_tp':>6} {'ep':>3} {'conc':>5} {'version':<16} {'TPOT':>7} {'trtkv':>7} "
          f"{'error':>7} {'TTFT':>8} {'trtkv':>8}")
    for c in got:
        print(f"{c['tp']:>3} {c['attention_dp']:>3} {c['moe_tp']:>6} {c['ep']:>3} {c['concurrency']:>5} "
              f"{c['version']:<16} {c['tpot_ms']:>7.2f} {c['trtkv_tpot_ms']:>7.2f} {c['error']:>+7.1%} "
              f"{c['ttft_ms']:>8.1f} {c['trtkv_ttft_ms']:>8.1f}")
    errors = [float(c["error"]) for c in got]
    if errors:
        print(f"TPOT: {sum(abs(e) <= BAND for e in errors)} of {len(errors)} within {BAND:.0%}; median error "
              f"{statistics.median(errors):+.1%}, median |error| {statistics.median(abs(e) for e in errors):.1%}. "
              "TTFT not judged (arrival unknown).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
