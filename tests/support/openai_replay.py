"""A deterministic OpenAI-compatible completions server for client measurements (dev-only: tests/support/, used by
the tests and the benchmarks).

It answers GET /v1/models and POST /v1/completions: streamed, one vLLM 0.32-shaped SSE chunk per token (" the"), the
first `first_ms` after the request, the next ones `gap_ms` apart, `max_tokens` of them, the usage chunk when
`stream_options.include_usage` asks for it, then `data: [DONE]`. With no model behind it, every client's TTFT and
ITL should read first_ms and gap_ms; two clients that disagree here disagree on measurement, not on the server.
It runs in a process of its own (as a real server does), so its threads never share a client's GIL.

    .venv/bin/python tests/support/openai_replay.py --first-ms 300 --gap-ms 50     # prints the port, serves until killed
"""

from __future__ import annotations

import argparse
import http.server
import json
import multiprocessing
import socketserver
import time
from typing import Any

MODEL = "replay"


def chunk(text: str | None, finish: str | None = None, usage: dict[str, int] | None = None) -> bytes:
    choices = [] if text is None else [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                                        "stop_reason": None, "token_ids": None, "prompt_logprobs": None,
                                        "prompt_token_ids": None}]
    event = {"id": "cmpl-replay", "object": "text_completion", "created": 0, "model": MODEL, "choices": choices,
             "usage": usage}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def serve(first_s: float, gap_s: float, port_out: Any, default_tokens: int = 16, api_key: str | None = None) -> None:
    """Serve on 127.0.0.1 (a free port, put on `port_out`) until the process is terminated. `api_key`: every /v1
    request must carry `Authorization: Bearer <key>` (401 otherwise), as vLLM's --api-key asks."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _json(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _refused(self) -> bool:
            if api_key is None or not self.path.startswith("/v1") \
                    or self.headers.get("Authorization") == f"Bearer {api_key}":
                return False
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._json(401, {"error": {"message": "Unauthorized"}})
            return True

        def do_GET(self) -> None:  # noqa: N802 - the http.server hook's name
            if self._refused():
                return
            if self.path.rstrip("/") == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "replay"}]})
            elif self.path in ("/health", "/v1/health"):
                self._json(200, {})
            else:
                self._json(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:  # noqa: N802
            start = time.monotonic()
            if self._refused():
                return
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path != "/v1/completions" or not body.get("stream"):
                self._json(400, {"error": {"message": "this replay server streams /v1/completions only"}})
                return
            tokens = int(body.get("max_tokens") or default_tokens)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            parts = [chunk(" the", "length" if i == tokens - 1 else None) for i in range(tokens)]
            if (body.get("stream_options") or {}).get("include_usage"):
                parts.append(chunk(None, usage={"prompt_tokens": 0, "completion_tokens": tokens,
                                                "total_tokens": tokens}))
            for i, part in enumerate(parts + [b"data: [DONE]\n\n"]):
                if i < tokens:  # token i leaves at first + i * gap after the request arrived
                    time.sleep(max(0.0, start + first_s + i * gap_s - time.monotonic()))
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True

    server = Server(("127.0.0.1", 0), Handler)
    port_out.put(server.server_address[1])
    server.serve_forever()


def start(first_ms: float, gap_ms: float, default_tokens: int = 16,
          api_key: str | None = None) -> tuple[multiprocessing.Process, int]:
    """The server in a daemon process of its own; (process, port). Stop it with process.terminate()."""
    ports: Any = multiprocessing.Queue()
    proc = multiprocessing.Process(target=serve, args=(first_ms / 1e3, gap_ms / 1e3, ports, default_tokens, api_key),
                                   daemon=True)
    proc.start()
    return proc, int(ports.get(timeout=30))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--first-ms", type=float, default=300.0, help="time to the first token")
    ap.add_argument("--gap-ms", type=float, default=50.0, help="time between tokens")
    args = ap.parse_args()
    proc, port = start(args.first_ms, args.gap_ms)
    print(f"replay server on 127.0.0.1:{port} (model {MODEL!r}); Ctrl-C stops it", flush=True)
    try:
        proc.join()
    except KeyboardInterrupt:
        proc.terminate()


if __name__ == "__main__":
    main()
