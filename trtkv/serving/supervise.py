"""The supervisor `trtkv serve` starts next to the server: every `interval` seconds it sends real one-token
inferences (trtkv.serving.health: one or more per model instance, because Triton keeps answering "ready" while an instance
is dead), and when the server is down, or degraded on `failures` probes in a row, it restarts it (end the server's
whole process session and wait until it is empty and its GPU memory free: the `cleaned` event says how many processes;
then start and wait for readiness; a canary answered "Stub process ... is not healthy" restarts at once), at most
`max_restarts` times per `window_s`, waiting longer before each restart
(`backoff_s` doubling, at most 60 s). Every event goes to engines/<recipe>/serve/events.jsonl with its cause; its
state and pid to serve/supervisor.json. `trtkv status` reads both; `trtkv stop` ends the supervisor, then the server.
A session that cannot be emptied (a process in D state, EPERM) is a `cleanup_failed` event and the supervisor gives
up rather than loop. A supervisor that is killed leaves its server running: `trtkv status` then says "unsupervised"
and `trtkv serve RECIPE --attach` starts a new supervisor for it.

While a benchmark measures this server (`trtkv bench`, `make bench-crosscheck`: `quiet` below), the supervisor sends
no canaries and checks only that the process is alive and ready: a canary is a real engine step, and on vLLM CPU one
that overlaps a measured request's arrival delays its first token by a whole step (the `quiet` and `canaries_resumed`
events say when).

    python -m trtkv.serving.supervise RECIPE [section.key=value ...]     (what `trtkv serve` runs, detached)
"""  # noqa: E501

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from trtkv.contracts.artifacts import SupervisorRecord
from trtkv.core import sessions
from trtkv.core.errors import TrtkvError
from trtkv.recipe import Recipe
from trtkv.recipe.layout import serve_dir
from trtkv.serving.supervisor_state import (
    alive,
    events_path,
    quiet_dir,
    quiet_holders,
    read_record,
    record_path,
)

LOG = "supervisor.log"
MAX_BACKOFF_S = 60.0
# What Triton answers for a model instance whose Python backend stub died: a definite failure,
# restart at once
DEAD_INSTANCE = "is not healthy"
# a failed server's in-flight requests never finish: do not wait tritonserver's 30 s exit timeout
STOP_TIMEOUT_S = 5.0


@contextmanager
def quiet(recipe: Recipe, who: str, address: str | None = None) -> Iterator[bool]:
    """Ask the recipe's supervisor to send no canaries while the block runs (a benchmark of its
    server). `address`: the HOST:PORT being measured (None: the recorded server's own); another
    server's address asks nothing. Yields whether it asked."""
    from trtkv.contracts.artifacts import ServerRecord
    from trtkv.serving.pool import measured

    server = ServerRecord.load(serve_dir(recipe)) if alive(recipe) else None
    ours = server is not None and (address is None or measured(server, address))
    if not ours:
        yield False
        return
    path = quiet_dir(recipe) / f"{os.getpid()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {
                "pid": os.getpid(),
                # with the pid, proves the holder (a reused pid starts later): supervisor_state
                "start_time": sessions.start_time(os.getpid()),
                "command": [sys.executable],
                "who": who,
                "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
        )
        + "\n"
    )
    tmp.replace(path)
    try:
        yield True
    finally:
        path.unlink(missing_ok=True)


class Supervisor:
    def __init__(
        self,
        recipe: Recipe,
        *,
        interval_s: float = 5.0,
        failures: int = 2,
        max_restarts: int = 5,
        window_s: float = 600.0,
        backoff_s: float = 2.0,
        canaries: int | None = None,
        canary_timeout_s: float = 15.0,
        log: Callable[[str], None] = print,
    ) -> None:
        self.recipe, self.interval_s, self.failures = recipe, interval_s, failures
        self.max_restarts, self.window_s, self.backoff_s = max_restarts, window_s, backoff_s
        # None: health.default_canaries (Triton: 2 per instance; OpenAI servers: 1)
        self.canaries = canaries
        self.quiet_for: list[str] = []
        self.canary_timeout_s = canary_timeout_s
        self.log = log
        self.restarts: list[float] = []
        self.state = "starting"
        self.stopping = False

    # -- record and events
    def event(self, kind: str, **detail: Any) -> None:
        from trtkv.serving.launch import open_log  # as main() below: launch is the server's start

        entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "event": kind, **detail}
        events_path(self.recipe).parent.mkdir(parents=True, exist_ok=True)
        # appended as the logs are, never through a link planted at its name (O_NOFOLLOW)
        with open_log(events_path(self.recipe), append=True) as fh:
            fh.write((json.dumps(entry) + "\n").encode())
        self.log(f"supervise {self.recipe.name}: {kind} {json.dumps(detail)}")

    def save(self, state: str) -> None:
        self.state = state
        SupervisorRecord(
            pid=_pid(),
            start_time=sessions.start_time(_pid()),
            command=[sys.executable, "-m", "trtkv.serving.supervise", *sys.argv[1:]],
            state=state,
            interval_s=self.interval_s,
            failures=self.failures,
            max_restarts=self.max_restarts,
            window_s=self.window_s,
            restarts=len(self.restarts),
            updated_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        ).save(serve_dir(self.recipe))

    # -- the loop
    def probe(self) -> tuple[str, str]:
        """(state, cause) from the real canaries: healthy, degraded, dead (an instance is reported
        dead) or down."""
        from trtkv.serving import health

        holders = [f"{h.get('who', '?')} (pid {h.get('pid')})" for h in quiet_holders(self.recipe)]
        if holders != self.quiet_for:
            if holders:
                self.event(
                    "quiet",
                    holders=holders,
                    note="no canaries while measured; alive and ready only",
                )
            else:
                self.event("canaries_resumed")
            self.quiet_for = holders
        result = health.check(
            self.recipe, canaries=0 if holders else self.canaries, timeout_s=self.canary_timeout_s
        )
        failed = [p for p in result.checks.get("canaries", []) if not p["ok"]]
        if result.state == "absent":
            return "down", "no server recorded (server.json is gone)"
        if result.state == "down":
            why = (
                "the server process exited"
                if not result.checks.get("alive")
                else "the ready endpoint does not answer "
                f"({result.checks.get('ready_error', 'not 200')})"
            )
            return "down", why
        if failed:
            dead = [p for p in failed if DEAD_INSTANCE in p["detail"]]
            return (
                "dead" if dead else "degraded",
                f"{len(failed)} of {len(result.checks['canaries'])} canaries failed: "
                f"{(dead or failed)[0]['detail']}",
            )
        return "healthy", ""

    def run(self, rounds: int | None = None) -> int:
        """Probe until stopped (or `rounds` probes, for tests); returns 0 when stopped, 1 when it
        gave up."""
        self.save("healthy")
        self.event("supervising", interval_s=self.interval_s, canaries=self.canaries or "default")
        bad, n = 0, 0
        while not self.stopping and (rounds is None or n < rounds):
            n += 1
            state, cause = self.probe()
            if self.stopping:
                break
            if state == "healthy":
                if self.state != "healthy":
                    self.event("healthy")
                bad = 0
                self.save("healthy")
            else:
                bad += 1
                self.event("probe_failed", state=state, cause=cause, in_a_row=bad)
                self.save("degraded" if state == "dead" else state)
                # a slow canary alone may be load: twice
                if state in ("down", "dead") or bad >= self.failures:
                    if not self.restart(cause):
                        return 1
                    bad = 0
            self.sleep(self.interval_s)
        return 0

    def restart(self, cause: str) -> bool:
        """Stop and start the server; False when the restart budget is spent (the supervisor then
        gives up)."""
        from trtkv.serving import serve, teardown

        now = time.monotonic()
        self.restarts = [t for t in self.restarts if now - t < self.window_s]
        if len(self.restarts) >= self.max_restarts:
            self.event(
                "gave_up",
                cause=cause,
                restarts_in_window=len(self.restarts),
                window_s=self.window_s,
            )
            self.save("failed")
            return False
        wait = min(MAX_BACKOFF_S, self.backoff_s * 2 ** len(self.restarts))
        self.restarts.append(now)
        self.save("restarting")
        self.event("restarting", cause=cause, attempt=len(self.restarts), backoff_s=wait)
        started = time.monotonic()
        if not self.clean(
            teardown.stop_server(self.recipe, timeout_s=STOP_TIMEOUT_S, log=self.log)
        ):
            return False
        self.sleep(wait)
        if self.stopping:
            return True
        try:
            info = serve.start(self.recipe, log=self.log)
        except TrtkvError as exc:
            self.event("restart_failed", cause=str(exc).splitlines()[0])
            self.save("down")
            return True  # the next probe sees it down and tries again, within the budget
        self.event(
            "restarted",
            pid=info.pid if info else None,
            seconds=round(time.monotonic() - started, 1),
            ready_seconds=info.ready_seconds if info else None,
        )
        self.save("healthy")
        return True

    def clean(self, stopped: Any) -> bool:
        """Say what ending the old server's session did; False (gave up) when some process of it
        could not be ended: a restart beside it would loop (its port, its GPU memory)."""
        if stopped is None:
            self.event("cleaned", processes=0, note="cleaned: 0 processes (no server recorded)")
            return True
        ended = len(stopped.cleanup.ended)
        if not stopped.done:
            left = stopped.cleanup.left + [
                f"pid {p} (not proven the server's)" for p in stopped.doubtful
            ]
            left += [stopped.container_failed] if stopped.container_failed else []
            self.event(
                "cleanup_failed",
                ended=ended,
                left=left,
                note="a process in D state waits on the kernel; EPERM: not ours. Not restarting "
                "beside it.",
            )
            self.event("gave_up", cause="the old server's session could not be emptied", left=left)
            self.save("failed")
            return False
        self.event(
            "cleaned",
            processes=ended,
            seconds=stopped.cleanup.seconds,
            gpu=stopped.gpu_note,
            killed=stopped.cleanup.killed,  # what SIGTERM and the grace did not end
            note=f"cleaned: {ended} processes",
        )
        return True

    def sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < end:
            time.sleep(min(0.2, end - time.monotonic()))


def _pid() -> int:
    import os

    return os.getpid()


def spawn(recipe: Recipe, spec: list[str], log: Callable[[str], None] = print) -> SupervisorRecord:
    """Start the supervisor for `recipe` detached (its own session); `spec`: the recipe name or path
    and overrides."""
    from trtkv.serving.launch import open_log, serve_folder

    out = serve_folder(recipe)
    cmd = [sys.executable, "-m", "trtkv.serving.supervise", *spec]
    with open_log(out / LOG, append=True) as fh:
        proc = subprocess.Popen(
            cmd,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:  # its first record says it is running
        record = read_record(recipe)
        if record and record.pid == proc.pid:
            log(
                f"serve: supervisor (pid {proc.pid}) probes {recipe.name} with real one-token "
                f"inferences every {record.interval_s:g} s and restarts it when it fails; events "
                f"in {events_path(recipe)}"
            )
            return record
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise TrtkvError(
        f"the supervisor for {recipe.name} did not start (exit {proc.poll()}); see {out / LOG}"
    )


def main(argv: list[str] | None = None) -> int:
    from trtkv.recipe import load_recipe

    ap = argparse.ArgumentParser(
        prog="python -m trtkv.serving.supervise",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("recipe")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument(
        "--interval", type=float, default=5.0, help="seconds between probes (default 5)"
    )
    ap.add_argument(
        "--canary-timeout",
        type=float,
        default=15.0,
        help="seconds a one-token inference may take before it counts as failed (default 15; a "
        "request sent to a dead instance hangs rather than fails)",
    )
    args = ap.parse_args(argv)
    recipe = load_recipe(args.recipe, args.overrides)
    sup = Supervisor(
        recipe,
        interval_s=args.interval,
        canary_timeout_s=args.canary_timeout,
        log=lambda m: print(time.strftime("%H:%M:%S"), m, flush=True),
    )

    def on_term(_signum: int, _frame: Any) -> None:
        # unwind wherever it is: a serve.start in progress stops the server it was starting
        sup.stopping = True
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        return sup.run()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if sup.stopping:
            sup.event("stopped")
        if (mine := read_record(recipe)) is not None and mine.pid == _pid():
            record_path(recipe).unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main())
