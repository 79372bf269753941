"""Single-stream decode ms/token: trtkv's reference runtime at two git revisions, interleaved, and vLLM CPU on
the same model folder, in one run; prints the table and the ratios (issue #57).

The model is the recipe's HF folder (SmolLM2-135M-Instruct, converted once from the packaged GGUF). The reference
runtime loads it as the LLM API layout does (ReferenceRuntime.load_hf) with an FP8 KV cache at scale 1.0, the
smollm2_fp8kv engine's KV numerics; its weights run in float32 whatever they are stored in. One prompt of
--input-tokens ids, greedy, EOS ignored; ms/token = (time of 1 + T tokens - time of 1 token) / T, so the prefill is
left out. Each reference measurement is a fresh process (the `before` code from `git archive REV trtkv`, the `after`
code from this tree), before and after alternating round by round so a shared machine's load falls on both; vLLM
(.venv-vllm, offline LLM, eager, one process) runs after them. The load average is printed beside the figures, and
each reference process's own CPU time per token beside its wall time: on a shared machine the other work slows the
CPU time far less (the caches and memory bandwidth are still shared), so its paired ratio is the steadier one there.

  $ .venv/bin/python benchmarks/decode_speed.py --before main --rounds 3
  $ make bench-decode-speed DECODE_ARGS="--before HEAD~1 --no-vllm"
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "smollm2_fp8kv"

REFERENCE_WORKER = """
import json, sys, time
import torch
from trtkv.runtime import ReferenceRuntime
folder, tokens, isl, repeats, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rt = ReferenceRuntime.load_hf(folder, threads=threads).with_kv_format("fp8_scale1")
ids = [100 + i % 1000 for i in range(isl)]
kw = dict(end_id=-1) if "end_id" in ReferenceRuntime.generate.__code__.co_varnames else {}
rt.generate(ids, max_tokens=4, **kw)
runs, cpu = [], []
for _ in range(repeats):
    t, c = time.perf_counter(), time.process_time(); rt.generate(ids, max_tokens=1, **kw)
    one, one_cpu = time.perf_counter() - t, time.process_time() - c
    t, c = time.perf_counter(), time.process_time(); out = rt.generate(ids, max_tokens=1 + tokens, **kw)
    many, many_cpu = time.perf_counter() - t, time.process_time() - c
    runs.append((many - one) / (len(out) - 1) * 1000)
    cpu.append((many_cpu - one_cpu) / (len(out) - 1) * 1000)
print(json.dumps({"ms_per_token": runs, "cpu_ms_per_token": cpu, "threads": torch.get_num_threads()}))
"""

VLLM_WORKER = """
import json, sys, time
from vllm import LLM, SamplingParams
folder, tokens, isl, repeats, dtype = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
llm = LLM(model=folder, dtype=dtype, max_model_len=1024, enforce_eager=True, max_num_seqs=4)
ids = [100 + i % 1000 for i in range(isl)]
def run(n):
    p = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    t = time.perf_counter(); llm.generate([{"prompt_token_ids": ids}], p, use_tqdm=False); return time.perf_counter() - t
run(4)
runs = [(run(1 + tokens) - run(1)) / tokens * 1000 for _ in range(repeats)]
print("RESULT " + json.dumps({"ms_per_token": runs}))
"""


def model_folder() -> Path:
    from trtkv.checkpoints.models import resolve_model_dir
    from trtkv.recipe import load_recipe

    return Path(resolve_model_dir(load_recipe(RECIPE)))


def export_rev(rev: str, dest: Path) -> Path:
    """The trtkv package of git revision `rev`, unpacked under dest."""
    archive = dest / "code.tar"
    with archive.open("wb") as f:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev, "trtkv"], stdout=f, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    return dest


def reference(code: Path, folder: Path, args: argparse.Namespace) -> tuple[list[float], list[float]]:
    """(wall ms/token, CPU ms/token) per measurement: the CPU time is the process's own, so a shared
    machine's other work slows it far less than the wall time (it still shares caches and memory)."""
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": str(args.threads)}
    cmd = [sys.executable, "-c", REFERENCE_WORKER, str(folder), str(args.tokens), str(args.input_tokens),
           str(args.repeats), str(args.threads)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, cwd=code)
    if done.returncode != 0:
        raise SystemExit(f"reference worker for {code} failed:\n{done.stderr[-3000:]}")
    got = json.loads(done.stdout.strip().splitlines()[-1])
    return list(got["ms_per_token"]), list(got.get("cpu_ms_per_token", []))


def vllm(folder: Path, args: argparse.Namespace) -> list[float] | None:
    python = ROOT / ".venv-vllm" / "bin" / "python"
    if not python.is_file():
        print(f"vLLM: {python} missing (make install-vllm); left out")
        return None
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": str(args.threads),
           "VLLM_CPU_CI_ENV": "1"}
    env.pop("PYTHONPATH", None)
    cmd = [str(python), "-c", VLLM_WORKER, str(folder), str(args.tokens), str(args.input_tokens),
           str(args.repeats), args.vllm_dtype]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        print(f"vLLM worker failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        return None
    return list(json.loads(lines[-1][len("RESULT "):])["ms_per_token"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", default="main", help="git revision of the `before` reference runtime")
    p.add_argument("--rounds", type=int, default=3, help="before/after alternations (fresh processes)")
    p.add_argument("--repeats", type=int, default=2, help="measurements per process")
    p.add_argument("--tokens", type=int, default=32, help="decoded tokens per measurement")
    p.add_argument("--input-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=1, help="torch/OMP threads (a served instance runs 1)")
    p.add_argument("--vllm-dtype", default="bfloat16", help="vLLM's dtype (its CPU default: bfloat16)")
    p.add_argument("--no-vllm", action="store_true")
    p.add_argument("--json", type=Path, help="write the figures here too")
    args = p.parse_args()
    folder = model_folder()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()
    figures: dict[str, list[float]] = {"before": [], "after": []}
    cpu: dict[str, list[float]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        before = export_rev(args.before, Path(tmp))
        for r in range(args.rounds):
            for name, code in (("before", before), ("after", ROOT)):
                wall, own = reference(code, folder, args)
                figures[name] += wall
                cpu[name] += own
                print(f"round {r + 1}: {name} {statistics.median(figures[name]):.1f} ms/token so far "
                      f"(CPU {statistics.median(cpu[name]):.1f})", flush=True)
    if not args.no_vllm:
        got = vllm(folder, args)
        if got:
            figures[f"vllm ({args.vllm_dtype})"] = got
    load_after = os.getloadavg()
    model = next((line.split(":", 1)[1].strip() for line in
                  subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines()
                  if line.startswith("Model name")), "?")
    print(f"\n{started}, {model}, {os.cpu_count()} CPUs, {args.threads} thread(s), load average "
          f"{load_before[0]:.1f} at start, {load_after[0]:.1f} at end; {args.input_tokens}-token prompt, "
          f"{args.tokens} tokens, model {folder.name}")
    print(f"{'runtime':<28}{'median ms/token':>16}{'min':>8}{'max':>8}  n")
    for name, runs in figures.items():
        label = f"reference @{args.before}" if name == "before" else "reference (this tree)" if name == "after" \
            else name
        print(f"{label:<28}{statistics.median(runs):>16.1f}{min(runs):>8.1f}{max(runs):>8.1f}  {len(runs)}")
    med = {k: statistics.median(v) for k, v in figures.items() if v}
    # each round's before and after ran back to back: their ratio sees the same load, the pooled medians need not
    paired = [b / a for b, a in zip(figures["before"], figures["after"], strict=True)]
    print(f"speedup before/after: {med['before'] / med['after']:.2f}x of the medians; paired per measurement "
          f"{', '.join(f'{r:.2f}' for r in paired)} (median {statistics.median(paired):.2f}x)")
    paired_cpu = [b / a for b, a in zip(cpu["before"], cpu["after"], strict=True)]
    print(f"CPU time of the reference process: before {statistics.median(cpu['before']):.1f}, after "
          f"{statistics.median(cpu['after']):.1f} ms/token; paired {', '.join(f'{r:.2f}' for r in paired_cpu)} "
          f"(median {statistics.median(paired_cpu):.2f}x)")
    for name in med:
        if name.startswith("vllm"):
            print(f"reference (this tree) / {name}: {med['after'] / med[name]:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"date": started, "cpu": model, "load": [load_before, load_after],
                                         "figures": figures, "cpu_ms_per_token": cpu}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
