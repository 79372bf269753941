"""Soak and fault run on loopback: N streaming gRPC clients for T seconds against the supervised server of a recipe,
with cancellations and malformed requests mixed in, and one `tensorrt_llm` model instance killed (SIGKILL of its
Python backend stub) in the middle. Prints and writes (JSON) answered / lost / mismatched / errors / recovery time,
then checks what the reliability issue asks: once the server is back (restarted and answering; at most --after-kill s
after the kill), 20 of 20 requests (--clients at a time) succeed, `trtkv status`
shows the restart and no process of the killed server's session survives. Then the fault matrix (benchmarks/faults.py,
`--faults`, default all): kill the main process, kill one child, kill the supervisor, interrupt a start, each with
its expected recovery (written there) and a check that nothing of the dead session survives; at the end every port is
free. Recipes without the Triton ensemble (llmapi layout, vLLM) run the fault matrix only.

    python benchmarks/soak.py smollm2_fp8kv --clients 8 --seconds 180          (make soak)
    python benchmarks/soak.py smollm2_fp8kv --clients 4 --seconds 30 --faults supervisor   (the e2e test's short run)
    python benchmarks/soak.py smollm2_fp8kv_vllm            (make soak RECIPE=smollm2_fp8kv_vllm: the fault matrix)

Definitions: `answered` = a normal request whose final response came, text equal to the prompt's solo greedy answer
(`mismatched` otherwise); `errors` = requests answered with an error (expected while the server restarts: each is
listed with its time); `lost` = requests with neither an answer nor an error within --request-timeout; malformed
requests must get an error (`bad_answered`), and cancelled ones must end (`cancelled`). `recovery_s` = from the kill
to the start of the last request that failed (every request sent after it succeeded). `in_flight_at_kill` = each
request running at the kill and how it ended: one on the killed stub hangs in Triton until the supervisor ends that
server, then gets UNAVAILABLE ("Socket closed"), an error like any other; `clients_done_at_s` = when the last client
returned, from the kill. A request the client gives up on (--request-timeout) is cancelled by the client and lost.
The server is started here (free ports, `trtkv serve`, so with its supervisor) and stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["The capital of France is", "Water is made of", "One, two, three,", "The largest planet is",
           "Q: 2+2=? A:", "Once upon a time", "The author of Hamlet is", "My favourite colour is"]
MAX_TOKENS = 12


@dataclass
class Outcome:
    kind: str  # normal | cancel | malformed
    prompt: int
    start: float
    end: float
    text: str = ""
    error: str | None = None
    final: bool = False


@dataclass
class Summary:
    recipe: str
    clients: int
    seconds: float
    requests: int = 0
    answered: int = 0
    mismatched: int = 0
    errors: int = 0
    errors_before_kill: int = 0
    lost: int = 0
    cancelled: int = 0
    bad_answered: int = 0
    bad_lost: int = 0
    killed_pid: int | None = None
    kill_at_s: float | None = None
    recovery_s: float | None = None
    checks_at_s: float | None = None  # when the 20 checks started, from the kill
    checks_s: float | None = None  # how long the 20 checks took
    clients_done_at_s: float | None = None  # when the last client had returned, from the kill
    in_flight_at_kill: list[dict[str, Any]] = field(default_factory=list)  # the requests running at the kill: how each ended
    after_kill_ok: int = 0
    after_kill_sent: int = 0
    restarts_seen: int = 0
    dead_session_left: list[int] = field(default_factory=list)  # processes of the killed server's session still alive
    faults: list[dict[str, Any]] = field(default_factory=list)  # the fault matrix (benchmarks/faults.py)
    ports_free: bool = False  # after the final `trtkv stop`
    # processes of the first server's session or the last one's still alive when the final `trtkv stop` returned
    left_after_stop: list[str] = field(default_factory=list)
    streamed: bool = True  # the streaming soak ran (Triton ensemble recipes)
    error_times_s: list[float] = field(default_factory=list)
    lost_requests: list[dict[str, Any]] = field(default_factory=list)
    mismatches: list[dict[str, Any]] = field(default_factory=list)
    passed: bool = False


def inputs(prompt: str, max_tokens: int, extra: dict[str, Any] | None = None, stream: bool = True) -> list[Any]:
    """The ensemble's gRPC inputs (text_input, max_tokens, stream, plus `extra` arrays by name)."""
    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    values = {"text_input": np.array([[prompt.encode()]], dtype=object),
              "max_tokens": np.array([[max_tokens]], dtype=np.int32), "stream": np.array([[stream]], dtype=bool)}
    values.update(extra or {})
    out = []
    for name, array in values.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        out.append(tensor)
    return out


def one_request(url: str, kind: str, prompt_index: int, timeout_s: float, t0: float) -> Outcome:
    """One streaming request: normal, cancelled after its first part, or malformed (max_tokens 0)."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    out = Outcome(kind, prompt_index, time.monotonic() - t0, 0.0)
    parts: list[str] = []
    # first: the first part came or the request ended (an error before any part ends a "cancel" request's wait too)
    done, first, cancelling = threading.Event(), threading.Event(), threading.Event()

    def callback(result: Any, error: Any) -> None:
        if error is not None:
            if not cancelling.is_set():  # "locally cancelled" after our own cancel is not an error
                out.error = str(error)
            done.set()
            first.set()
            return
        text = result.as_numpy("text_output")
        if text is not None and text.size:
            parts.append(text.reshape(-1)[0].decode("utf-8", errors="replace"))
            first.set()
        final = result.get_response().parameters.get("triton_final_response")
        if final is not None and final.bool_param:
            out.final = True
            done.set()
            first.set()

    extra = {"max_tokens": np.array([[0]], dtype=np.int32)} if kind == "malformed" else None
    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=callback)
        client.async_stream_infer("ensemble", inputs(PROMPTS[prompt_index], MAX_TOKENS, extra),
                                  enable_empty_final_response=True)
        if kind == "cancel" and first.wait(timeout_s) and not done.is_set():
            cancelling.set()
            client.stop_stream(cancel_requests=True)  # the client goes away mid-stream
            out.final = True  # ended by us
        elif not done.wait(0 if kind == "cancel" else timeout_s):
            # neither answer nor error within the timeout: lost. Cancel it, or closing the stream below would wait
            # for the server to end it (our own cancel is not an error)
            cancelling.set()
            client.stop_stream(cancel_requests=True)
            out.final = False
    except Exception as exc:  # noqa: BLE001 - a refused connection while the server restarts is an error outcome
        out.error = f"{type(exc).__name__}: {exc}"
    finally:
        try:
            client.stop_stream()
            client.close()
        except Exception:  # noqa: BLE001
            pass
    out.text, out.end = "".join(parts), time.monotonic() - t0
    return out


def stub_pids(server_pid: int, model: str = "tensorrt_llm") -> list[int]:
    """The Python backend stubs of `model`'s instances under the server (their argv names model/1/model.py)."""
    import psutil

    out = []
    for child in psutil.Process(server_pid).children(recursive=True):
        try:
            cmd = child.cmdline()
        except psutil.Error:
            continue
        if cmd and cmd[0].endswith("triton_python_backend_stub") and f"/{model}/1/model.py" in " ".join(cmd):
            out.append(child.pid)
    return sorted(out)


def trtkv(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trtkv", *args], capture_output=True, text=True, cwd=ROOT)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recipe", nargs="?", default="smollm2_fp8kv")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=180.0)
    ap.add_argument("--kill-at", type=float, default=0.5, help="fraction of --seconds at which to kill an instance")
    ap.add_argument("--cancel-every", type=int, default=7, help="every n-th request is cancelled mid-stream")
    ap.add_argument("--malformed-every", type=int, default=5, help="every n-th request is malformed")
    ap.add_argument("--after-kill", type=float, default=None,
                    help="at most this many seconds after the kill, the 20 checks start (sooner once the server is "
                         "back; default: the issue's heal bound, benchmarks/faults.py HEAL_S = 90)")
    ap.add_argument("--request-timeout", type=float, default=120.0)
    ap.add_argument("--output", type=Path, default=None, help="JSON summary (default engines/<recipe>/soak.json)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--faults", default="all", help="the fault matrix after the soak: comma-separated of main, child, "
                                                    "supervisor, interrupt; all (default) or none")
    args = ap.parse_args(argv)
    if args.clients < 1 or args.seconds <= 0 or not 0 < args.kill_at < 1:
        ap.error("--clients >= 1, --seconds > 0 and 0 < --kill-at < 1")

    sys.path.insert(0, str(ROOT))
    from benchmarks import faults
    from trtkv.backends import for_recipe
    from trtkv.core.process import free_ports, port_in_use
    from trtkv.recipe import load_recipe

    wanted = faults.parse_faults(args.faults)
    if args.after_kill is None:
        args.after_kill = faults.HEAL_S

    http, grpc, metrics = free_ports(3)
    overrides = [f"triton.http_port={http}", f"triton.grpc_port={grpc}", f"triton.metrics_port={metrics}"]
    recipe = load_recipe(args.recipe, overrides)
    started = trtkv("serve", args.recipe, *overrides)
    print(started.stdout.strip() or started.stderr.strip())
    if started.returncode != 0:
        print(f"soak: `trtkv serve {args.recipe}` failed:\n{started.stderr}", file=sys.stderr)
        return 2
    summary = Summary(args.recipe, args.clients, args.seconds)
    summary.streamed = for_recipe(recipe).layout == "ensemble"  # the streaming client speaks the ensemble
    url = f"127.0.0.1:{grpc}"
    first = faults.record(recipe)
    try:
        if summary.streamed:
            solo = [one_request(url, "normal", i, args.request_timeout, time.monotonic()).text
                    for i in range(len(PROMPTS))]
            print(f"soak: solo answers for {len(PROMPTS)} prompts; {args.clients} clients for {args.seconds:g} s, "
                  f"one tensorrt_llm instance killed at {args.kill_at * args.seconds:.0f} s")
            run(args, recipe, url, solo, summary)
            if "child" in wanted:  # the stub killed under load above is this run's child fault
                wanted.remove("child")
                summary.faults.append({"fault": "child", "expected": faults.EXPECTED["child"],
                                       "passed": summary.passed, "killed_pid": summary.killed_pid,
                                       "healed_s": summary.recovery_s, "left": summary.dead_session_left,
                                       "detail": "killed under load by the streaming soak"})
        else:
            print(f"soak: {recipe.name} is not served as the Triton ensemble: the fault matrix only")
            summary.passed = True
        summary.faults += [asdict(r) for r in faults.run_matrix(recipe, [args.recipe, *overrides], wanted)]
    finally:
        said, _, summary.left_after_stop = faults.stop_and_list_left([args.recipe, *overrides],
                                                                     [first, faults.record(recipe)])
        print(said)
    t = recipe.triton
    summary.ports_free = not [p for p in (t.http_port, t.grpc_port, t.metrics_port) if port_in_use(t.host, p)]
    summary.passed = (summary.passed and summary.ports_free and not summary.left_after_stop
                      and all(f["passed"] for f in summary.faults))
    out = args.output or (ROOT / "engines" / recipe.name / "soak.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(asdict(summary), indent=2) + "\n")
    print(f"soak: requests {summary.requests}, answered {summary.answered}, mismatched {summary.mismatched}, "
          f"errors {summary.errors} ({summary.errors_before_kill} before the kill), lost {summary.lost}, "
          f"cancelled {summary.cancelled}, malformed answered with an error {summary.bad_answered} (lost "
          f"{summary.bad_lost}); killed stub pid {summary.killed_pid} at "
          f"{summary.kill_at_s} s, recovery {summary.recovery_s} s; {summary.after_kill_ok}/{summary.after_kill_sent} "
          f"ok, sent {summary.checks_at_s} s after the kill (at most {args.after_kill:g}; the clients were done "
          f"{summary.clients_done_at_s} s after it; the checks took {summary.checks_s} s); restarts in trtkv status: "
          f"{summary.restarts_seen}; left of the "
          f"killed session: {summary.dead_session_left}; ports free at the end: {summary.ports_free}; left when "
          f"`trtkv stop` returned: {summary.left_after_stop or 'nothing'}")
    for f in summary.faults:
        print(f"soak: fault {f['fault']}: {'passed' if f['passed'] else 'FAILED'}, healed in {f['healed_s']} s, "
              f"left {f['left']} ({f['detail']})")
    print(f"soak: {'PASSED' if summary.passed else 'FAILED'}; summary {out}")
    return 0 if summary.passed else 1


def restarts(args: argparse.Namespace, recipe: Any) -> int:
    """The restarts `trtkv status` lists for the recipe's server."""
    status = trtkv("status", args.recipe, *[f"triton.{k}_port={v}" for k, v in
                                            (("http", recipe.triton.http_port), ("grpc", recipe.triton.grpc_port),
                                             ("metrics", recipe.triton.metrics_port))], "--json")
    try:
        return sum(1 for e in json.loads(status.stdout)["events"] if e["event"] == "restarted")
    except (ValueError, KeyError):
        return 0


def recovered(args: argparse.Namespace, recipe: Any, url: str, t0: float) -> bool:
    """The supervisor has restarted the server and it answers a request again."""
    if restarts(args, recipe) < 1:
        return False
    probe = one_request(url, "normal", 0, min(args.request_timeout, 30.0), t0)
    return probe.final and not probe.error


# how a request ended -> the Summary field that counts it
ENDED_COUNTS = {"answered": "answered", "mismatched": "mismatched", "error": "errors", "lost": "lost",
                "cancelled": "cancelled", "bad_answered": "bad_answered", "bad_lost": "bad_lost"}


def _ended(o: Outcome, solo: list[str]) -> str:
    """How one request ended, in the summary's words."""
    if o.kind == "malformed":
        return "bad_answered" if o.error else "bad_lost"
    if o.error:
        return "error"
    if not o.final:
        return "lost"
    if o.kind == "cancel":
        return "cancelled"
    return "answered" if o.text == solo[o.prompt] else "mismatched"


def run(args: argparse.Namespace, recipe: Any, url: str, solo: list[str], summary: Summary) -> None:
    from trtkv.contracts.artifacts import ServerRecord
    from trtkv.recipe.layout import serve_dir

    rng = random.Random(args.seed)
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    counter = [0]
    t0 = time.monotonic()
    deadline = t0 + args.seconds

    current: dict[int, Outcome] = {}  # each client's request in progress (a client that never returns is lost)

    def client(index: int) -> None:
        while time.monotonic() < deadline:
            with lock:
                counter[0] += 1
                n = counter[0]
                prompt = rng.randrange(len(PROMPTS))
            kind = ("malformed" if n % args.malformed_every == 0 else "cancel" if n % args.cancel_every == 0
                    else "normal")
            with lock:
                current[index] = Outcome(kind, prompt, time.monotonic() - t0, 0.0)
            result = one_request(url, kind, prompt, args.request_timeout, t0)
            with lock:
                outcomes.append(result)
                del current[index]
            if result.error and kind != "malformed":
                time.sleep(0.5)  # a refused connection: do not spin

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(args.clients)]
    for t in threads:
        t.start()
    time.sleep(args.kill_at * args.seconds)
    server = ServerRecord.load(serve_dir(recipe))
    stubs = stub_pids(server.pid) if server else []  # `server`: the session that is about to die
    if stubs:
        summary.killed_pid = stubs[0]
        summary.kill_at_s = round(time.monotonic() - t0, 2)
        os.kill(stubs[0], signal.SIGKILL)
        print(f"soak: killed tensorrt_llm stub pid {stubs[0]} at {summary.kill_at_s} s")
    joined_by = deadline + args.request_timeout + 60  # every request returns within --request-timeout (then lost)
    for t in threads:
        t.join(max(0.0, joined_by - time.monotonic()))
    with lock:
        outcomes += [replace(o, end=time.monotonic() - t0) for o in current.values()]  # hung clients: lost below
    if summary.kill_at_s is not None:
        summary.clients_done_at_s = round(time.monotonic() - t0 - summary.kill_at_s, 2)
    # 20 requests (--clients at a time) once the server is back: `trtkv status` shows the restart and a request is
    # answered again (at most --after-kill s after the kill; the checks then run whatever state it is in)
    if summary.kill_at_s is not None:
        limit = t0 + summary.kill_at_s + args.after_kill
        while time.monotonic() < limit and not recovered(args, recipe, url, t0):
            time.sleep(1.0)
        summary.checks_at_s = round(time.monotonic() - t0 - summary.kill_at_s, 2)
    checks_start = time.monotonic()
    with ThreadPoolExecutor(args.clients) as pool:  # as many at a time as the soak's clients
        checks = list(pool.map(lambda i: one_request(url, "normal", i % len(PROMPTS), args.request_timeout, t0),
                               range(20)))
    summary.checks_s = round(time.monotonic() - checks_start, 2)
    if server is not None and stubs:
        from benchmarks.faults import dead_session_left

        summary.dead_session_left = dead_session_left(server)
    summary.after_kill_sent = len(checks)
    summary.after_kill_ok = sum(1 for c in checks if c.final and not c.error and c.text == solo[c.prompt])
    summary.restarts_seen = restarts(args, recipe)
    failed_start = 0.0
    for o in outcomes:
        summary.requests += 1
        ended = _ended(o, solo)
        setattr(summary, ENDED_COUNTS[ended], getattr(summary, ENDED_COUNTS[ended]) + 1)
        if ended == "error":
            summary.errors_before_kill += int(summary.kill_at_s is None or o.end < summary.kill_at_s)
            summary.error_times_s.append(round(o.start, 2))
            failed_start = max(failed_start, o.start)
        elif ended == "lost":
            summary.lost_requests.append({"prompt": PROMPTS[o.prompt], "kind": o.kind, "start_s": round(o.start, 2),
                                          "end_s": round(o.end, 2), "text_so_far": o.text})
        elif ended == "mismatched":
            summary.mismatches.append({"prompt": PROMPTS[o.prompt], "got": o.text, "solo": solo[o.prompt]})
    if summary.kill_at_s is not None:
        summary.in_flight_at_kill = [
            {"kind": o.kind, "start_s": round(o.start, 2), "end_s": round(o.end, 2), "ended": _ended(o, solo),
             "error": (o.error or "")[:200]} for o in outcomes if o.start <= summary.kill_at_s <= o.end]
        summary.recovery_s = round(max(0.0, failed_start - summary.kill_at_s), 2) if failed_start else 0.0
    summary.passed = (summary.lost == 0 and summary.mismatched == 0 and summary.bad_lost == 0 and summary.answered > 0
                      and summary.errors_before_kill == 0 and summary.cancelled > 0
                      and summary.killed_pid is not None and summary.after_kill_ok == summary.after_kill_sent
                      and summary.restarts_seen >= 1 and not summary.dead_session_left)


if __name__ == "__main__":
    sys.exit(main())
