"""The OpenAI client's own CPU per streamed token, without a model: a local server replays vLLM-shaped SSE events
(one chunk per token, `data: [DONE]` at the end, --gap-ms apart as a decoding server sends them), and `concurrency`
sessions stream from it through trtkv's OpenAI session. Prints the client's CPU time (thread CPU, measured in
each session) per event.

Against a real server on the same 2 cores (the vLLM recipe) `client_cpu_per_token` in results.json also carries the
cost of sharing the cores; this isolates the client's own.

    .venv/bin/python benchmarks/client_cost.py --concurrency 8 --tokens 16 --requests 40
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trtkv.bench.client import Endpoint, SamplingParams  # noqa: E402
from trtkv.bench.loadgen import Job, run_concurrency  # noqa: E402
from trtkv.bench.openai import OpenAISession  # noqa: E402
from trtkv.bench.records import RequestRecord  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tests.support.openai_replay import MODEL, start  # noqa: E402 - shared with the tests


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=16, help="events per request")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--gap-ms", type=float, default=5.0, help="pause between events, as a server decoding tokens "
                                                             "(0: everything at once)")
    args = ap.parse_args(argv)
    server, port = start(0.0, args.gap_ms, args.tokens)
    ep = Endpoint(f"127.0.0.1:{port}", "openai", MODEL)
    jobs = [Job(RequestRecord(f"r{i}", "latency", "cost", i, 1, args.tokens), "hi",
                SamplingParams(max_tokens=args.tokens)) for i in range(args.requests)]
    records = run_concurrency(lambda: OpenAISession(ep), jobs, args.concurrency, 60.0)
    failed = [r for r in records if not r.ok]
    events = sum(len(r.response_texts) for r in records)
    cpu_us = sum(r.client_cpu_ns for r in records) / 1e3
    print(f"concurrency {args.concurrency}, {args.requests} requests x {args.tokens} events: "
          f"{cpu_us / max(1, events):.1f} us of client CPU per streamed event; failed {len(failed)}")
    server.terminate()
    server.join()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
