"""Batch invariance of the reference runtime under load, and what batching costs: in-process, on the real SmolLM2.

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python benchmarks/batch_invariance_stress.py --perf      # c1 vs c8
    PYTHONPATH=$PWD nice -n 10 .venv/bin/python benchmarks/batch_invariance_stress.py --seconds 120  # stress
    PYTHONPATH=$PWD .venv/bin/python benchmarks/batch_invariance_stress.py --perf --modes off,on,off,on  # A/B

The runtime is packaged:smollm2 with FP8 weights and an FP8 KV cache (what `smollm2_fp8kv` serves), driven through
trtkv.runtime.batch.Batcher directly (no server). `--perf`: N requests one at a time (c1), then the same requests
with 8 in flight (c8): aggregate generated tokens/s and TTFT p50 of each; `--modes off,on,...` repeats that with the
batch-invariant mode off (the old default path) and on, interleaved in one process, for an A/B on a shared machine.
Stress: for `--seconds`, 8 client threads submit random prompts (the quiz prompts, "The capital of Egypt is",
prompts of other lengths), cancel some mid-way, and every finished greedy answer is compared token for token with
the same prompt's solo answer (a batch of one). Prints JSON lines; exit 1 when any answer differed. Not a test:
tests/runtime/test_batch_invariance.py is.
"""

# ruff: noqa: B023 - each client closure is joined before its loop variables change

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.runtime.test_batch_invariance import invariance_prompts, smollm2_fp8_runtime  # noqa: E402
from trtkv.runtime.batch import Batcher, make_sequence  # noqa: E402


def run_one(batcher: Batcher, runtime: Any, ids: list[int], max_tokens: int, cancel_after: int | None = None
            ) -> tuple[list[int], float, float]:
    """Submit one greedy request and wait: (tokens, TTFT seconds, total seconds)."""
    start, first, done = time.monotonic(), [0.0], threading.Event()
    out: list[list[int]] = [[]]

    def on_token(_t: int) -> bool:
        if not first[0]:
            first[0] = time.monotonic() - start
        return cancel_after is None or len(out[0]) < cancel_after

    def on_done(tokens: list[int], error: BaseException | None) -> None:
        out[0] = list(tokens) if error is None else [-1]
        done.set()

    batcher.submit(make_sequence(runtime, ids, max_tokens=max_tokens, end_id=-1, on_token=on_token, on_done=on_done))
    done.wait(600)
    return out[0], first[0], time.monotonic() - start


def perf(runtime: Any, prompts: list[list[int]], requests: int, max_tokens: int) -> dict[str, Any]:
    """c1 and c8 over the same requests: tokens/s and TTFT p50."""
    short = [p for p in prompts if len(p) < 200]  # the long prompt would dominate TTFT
    work = [short[i % len(short)] for i in range(requests)]
    result: dict[str, Any] = {}
    for conc in (1, 8):
        batcher = Batcher(runtime, max_batch_size=8)
        run_one(batcher, runtime, work[0], 4)  # warm-up
        ttfts: list[float] = []
        tokens = [0]
        lock = threading.Lock()
        queue = list(work)

        def client() -> None:  # noqa: B023 - joined before the loop moves on
            while True:
                with lock:
                    if not queue:
                        return
                    ids = queue.pop()
                got, ttft, _ = run_one(batcher, runtime, ids, max_tokens)
                with lock:
                    ttfts.append(ttft)
                    tokens[0] += len(got)

        start = time.monotonic()
        threads = [threading.Thread(target=client) for _ in range(conc)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - start
        batcher.shutdown()
        result[f"c{conc}"] = {"tokens_per_s": round(tokens[0] / wall, 2), "ttft_p50_s": round(statistics.median(ttfts), 4),
                              "requests": len(ttfts), "seconds": round(wall, 1)}
    result["c8_over_c1"] = round(result["c8"]["tokens_per_s"] / result["c1"]["tokens_per_s"], 2)
    return result


def stress(runtime: Any, prompts: list[list[int]], seconds: float, max_tokens: int, seed: int,
           max_num_tokens: int | None = None) -> dict[str, Any]:
    """8 clients for `seconds`: random prompts, some cancelled; every answer vs the prompt's solo answer."""
    solo_batcher = Batcher(runtime, max_batch_size=1)
    solo = [run_one(solo_batcher, runtime, p, max_tokens)[0] for p in prompts]
    solo_batcher.shutdown()
    batcher = Batcher(runtime, max_batch_size=8, max_num_tokens=max_num_tokens)
    stop = time.monotonic() + seconds
    counts = {"answers": 0, "differed": 0, "cancelled": 0, "cancelled_differed": 0}
    differing: list[int] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        rng = random.Random(seed + k)
        while time.monotonic() < stop:
            i = rng.randrange(len(prompts))
            cut = rng.randrange(1, max_tokens) if rng.random() < 0.2 else None
            got, _, _ = run_one(batcher, runtime, prompts[i], max_tokens, cancel_after=cut)
            with lock:
                if cut is None:
                    counts["answers"] += 1
                    if got != solo[i]:
                        counts["differed"] += 1
                        differing.append(i)
                else:  # a cancelled answer is a prefix of the solo one
                    counts["cancelled"] += 1
                    if got != solo[i][:len(got)]:
                        counts["cancelled_differed"] += 1
            time.sleep(rng.random() * 0.05)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    batcher.shutdown()
    return {**counts, "peak_batch": batcher.peak_batch, "steps": batcher.steps,
            "differing_prompts": sorted(set(differing))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--perf", action="store_true", help="c1 vs c8 throughput and TTFT instead of the stress")
    parser.add_argument("--modes", default="on", help="--perf: comma-separated on/off runs, interleaved (A/B)")
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--requests", type=int, default=24, help="--perf: requests per concurrency")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-num-tokens", type=int, default=None,
                        help="stress: prefill chunk budget (e.g. 24: long prompts prefilled between decode steps)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        runtime = smollm2_fp8_runtime(Path(tmp))
        prompts = [runtime.tokenizer(p, add_special_tokens=False)["input_ids"] for p in invariance_prompts()]
        if args.perf:
            runs = []
            for mode in args.modes.split(","):
                runtime.settings["batch_invariant"] = mode == "on"
                runs.append({"batch_invariant": mode, **perf(runtime, prompts, args.requests, args.max_tokens)})
                print(json.dumps(runs[-1]), flush=True)
            report = {"runs": runs}
        else:
            report = stress(runtime, prompts, args.seconds, args.max_tokens, args.seed, args.max_num_tokens)
    print(json.dumps({"threads": args.threads, "max_tokens": args.max_tokens, **report}))
    return 0 if args.perf or (report["differed"] == 0 and report["cancelled_differed"] == 0) else 1


if __name__ == "__main__":
    sys.exit(main())
