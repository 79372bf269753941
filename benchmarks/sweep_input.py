"""ITL and TTFT against input length, 16-bit vs FP8 KV, on this machine (`make bench-sweep-input`): the reference
runtime behind tritonserver (smollm2_fp16kv vs smollm2_fp8kv) and, where this CPU lets vLLM CPU hold an FP8 KV cache
(AVX-512 or AMX), vLLM (smollm2_fp16kv_vllm vs smollm2_fp8kv_vllm).

Each pair runs `trtkv compare` (calibrate, build, repo, serve, bench with `bench.sweep_input_tokens`, report, stop; one
recipe after the other, free ports of its own, latency only, concurrency 1) into OUTPUT/<pair>/, whose compare.md holds
the fits, the break-even and compare_itl_vs_input.png. OUTPUT/summary.md and summary.json add what the figures depend
on here: the CPU, its flags, the load average before and after (other work on the machine slows every step alike;
nothing here controls it).
Usage: python benchmarks/sweep_input.py [--pairs reference,vllm] [--lengths 128,512,1024,2048] [--requests 6]
       [--output-tokens 16]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PAIRS = {"reference": ("smollm2_fp16kv", "smollm2_fp8kv"), "vllm": ("smollm2_fp16kv_vllm", "smollm2_fp8kv_vllm")}


def cpu_facts() -> dict[str, Any]:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    flags = next((set(line.split(":", 1)[1].split()) for line in text.splitlines() if line.startswith("flags")), set())
    return {"model": model, "cores": os.cpu_count(), "avx512f": "avx512f" in flags, "amx_tile": "amx_tile" in flags,
            "avx2": "avx2" in flags}


def run_pair(name: str, lengths: str, requests: int, output_tokens: int, out: Path, ports: list[int]) -> dict[str, Any]:
    from trtkv.backends import vllm_command, vllm_cpu
    from trtkv.recipe import load_recipe

    base, quant = PAIRS[name]
    if name == "vllm":
        problem = vllm_cpu.cpu_fp8_kv_problem(load_recipe(quant))
        if problem or not vllm_command.vllm_python().is_file():
            return {"pair": name, "skipped": problem or f"{vllm_command.vllm_python()} missing (make install-vllm)"}
    first = lengths.split(",")[0].strip()  # the recipe's own length one of the sweep's: no extra level
    overrides = [f"bench.sweep_input_tokens=[{lengths}]", f"bench.input_tokens={first}",
                 f"bench.output_tokens={output_tokens}", "bench.tasks=[]", "bench.concurrency=[1]",
                 f"bench.num_requests={requests}", "bench.thresholds=[]", f"triton.http_port={ports[0]}",
                 f"triton.grpc_port={ports[1]}", f"triton.metrics_port={ports[2]}"]
    started = time.time()
    code = subprocess.run([sys.executable, "-m", "trtkv", "compare", "--recipes", f"{base},{quant}", "--output",
                           str(out / name), *overrides], check=False).returncode
    rows = json.loads((out / name / "compare.json").read_text()) if (out / name / "compare.json").exists() else []
    verdicts = rows[0].get("sweep_break_even", []) if rows else []
    return {"pair": name, "recipes": [base, quant], "exit_code": code, "seconds": round(time.time() - started, 1),
            "fits": {r["recipe"]: {lv: {k: b.get(k) for k in ("input_tokens", "itl_p50_ms", "itl_fit", "ttft_p50_ms",
                                                                "ttft_fit")}
                                   for lv, b in (r.get("sweep") or {}).get("levels", {}).items()} for r in rows},
            "break_even": [{k: v.get(k) for k in ("level", "verdict", "tokens", "crossing_tokens", "interval",
                                                  "measured_range")} for v in verdicts]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", default="reference,vllm")
    ap.add_argument("--lengths", default="128,512,1024,2048")
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--output-tokens", type=int, default=16, help="the same for both recipes of a pair")
    ap.add_argument("--output", type=Path, default=Path("engines/bench-sweep-input"))
    args = ap.parse_args()
    from trtkv.core.process import free_ports

    args.output.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"cpu": cpu_facts(), "load_before": os.getloadavg(), "lengths": args.lengths, "pairs": []}
    for name in [p.strip() for p in args.pairs.split(",") if p.strip()]:
        if name not in PAIRS:
            print(f"error: --pairs {name!r}: allowed {', '.join(PAIRS)}", file=sys.stderr)
            return 2
        summary["pairs"].append(run_pair(name, args.lengths, args.requests, args.output_tokens, args.output,
                                         free_ports(3)))
    summary["load_after"] = os.getloadavg()
    (args.output / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    lines = [f"# Input sweep on {summary['cpu']['model']} ({summary['cpu']['cores']} cores; AVX-512 "
             f"{summary['cpu']['avx512f']}, AMX {summary['cpu']['amx_tile']}); load average before "
             f"{summary['load_before'][0]:.1f}, after {summary['load_after'][0]:.1f}", ""]
    for p in summary["pairs"]:
        if "skipped" in p:
            lines.append(f"- {p['pair']}: skipped ({p['skipped']})")
            continue
        lines.append(f"- {p['pair']} ({' vs '.join(p['recipes'])}, exit {p['exit_code']}, {p['seconds']} s): see "
                     f"{p['pair']}/compare.md")
        for v in p["break_even"]:
            lines.append(f"  - {v['level']}: {v['verdict']} (crossing {v['crossing_tokens']}, 95% interval "
                         f"{v['interval']}, measured {v['measured_range']})")
    (args.output / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(p.get("exit_code", 0) == 0 for p in summary["pairs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
