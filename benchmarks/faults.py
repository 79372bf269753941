"""The fault matrix of `make soak` (benchmarks/soak.py runs it after the streaming soak): each fault on the recipe's
supervised server, its expected recovery written next to it, and after each a check that no process of the dead
session survives. Works for every local backend (Triton ensemble / llmapi layout with the Python stubs, vLLM): the
recovery is judged by trtkv.serving.health's real one-token canary, not by the streaming client.

    python benchmarks/faults.py smollm2_fp8kv_llmapi [KEY=VALUE ...] --faults main,supervisor   (alone: serves, stops)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HEAL_S = 90.0  # each fault heals within 90 s (the issue)

EXPECTED = {
    "main": "SIGKILL of the server's main process -> the supervisor sees it down, ends the rest of its session "
            "(event `cleaned: N processes`) and starts a new one: healthy within 90 s, nothing of the old session left",
    "child": "SIGKILL of one child (a Triton Python-backend stub of tensorrt_llm; vLLM's EngineCore) -> a canary fails "
             "or the server exits; the supervisor ends the whole session and restarts: healthy within 90 s, nothing "
             "of the old session left",
    "supervisor": "SIGKILL of the supervisor -> the server keeps serving and `trtkv status` says unsupervised; "
                  "`trtkv serve --attach` starts a new supervisor for it",
    "interrupt": "SIGINT to `trtkv serve` while the server is loading -> the start fails, no process of its session "
                 "survives, the ports are free and no server.json is left (runs last: the server stays stopped)",
}
STOPPED = ("`trtkv stop` returns only once no process is left of the first server's session nor of the one it "
           "stopped (started by the supervisor's restarts)")
ORDER = ["main", "child", "supervisor", "interrupt"]


@dataclass
class FaultResult:
    fault: str
    expected: str
    passed: bool = False
    healed_s: float | None = None
    killed_pid: int | None = None
    left: list[int] = field(default_factory=list)  # processes of the dead session still alive afterwards
    detail: str = ""


def trtkv(*args: str, timeout_s: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trtkv", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout_s)


def record(recipe: Any) -> Any:
    from trtkv.contracts.artifacts import ServerRecord
    from trtkv.recipe.layout import serve_dir

    return ServerRecord.load(serve_dir(recipe))


def dead_session_left(info: Any, timeout_s: float = 15.0) -> list[int]:
    """Live processes of `info`'s session after a bounded wait (the supervisor may still be ending them)."""
    from trtkv.core import sessions
    from trtkv.serving.teardown import session_of

    deadline = time.monotonic() + timeout_s
    while True:
        left = sessions.members(session_of(info))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def session_pids(info: Any) -> list[int]:
    """Every process of `info`'s session still in the process table, exited ones its parent has not reaped yet
    (zombies) included: what `ps -s SID` lists (by session id, started no earlier than the recorded leader)."""
    from trtkv.core import sessions

    found = [(int(n), sessions.stat(int(n))) for n in os.listdir("/proc") if n.isdigit()]
    return sorted(pid for pid, st in found if st is not None and st[1] == info.session_id
                  and st[2] >= (info.session_start or 0) and pid != os.getpid())


def stop_and_list_left(spec: list[str], records: list[Any]) -> tuple[str, list[int], list[str]]:
    """Run `trtkv stop`, and at once (no wait) list what is left of `records`' sessions (session_pids): (its output,
    their pids, and what each is: sessions.describe)."""
    from trtkv.core import sessions

    stopped = trtkv("stop", *spec)
    left = sorted({p for r in records if r is not None for p in session_pids(r)})
    return (stopped.stdout + stopped.stderr).strip(), left, [sessions.describe(p) for p in left]


def wait_healed(recipe: Any, old: Any, timeout_s: float = HEAL_S) -> float | None:
    """Seconds until a server with a NEW session answers a real canary; None after `timeout_s`."""
    from trtkv.serving import health

    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        now = record(recipe)
        if now is not None and now.session_id != old.session_id and health.check(recipe, canaries=1).state == "healthy":
            return round(time.monotonic() - start, 1)
        time.sleep(1.0)
    return None


def child_pid(info: Any) -> int | None:
    """One child of the server to kill: a Python-backend stub of tensorrt_llm (Triton), else vLLM's EngineCore."""
    from trtkv.core import sessions
    from trtkv.serving.teardown import session_of

    stubs, engines = [], []
    for pid in sessions.members(session_of(info)):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = b" ".join(argv).decode(errors="replace")
        if argv[0].endswith(b"triton_python_backend_stub") and "/tensorrt_llm/1/model.py" in text:
            stubs.append(pid)
        elif "EngineCore" in text:
            engines.append(pid)
    found = sorted(stubs) or sorted(engines)
    return found[0] if found else None


def _restart_fault(recipe: Any, fault: str, pid: int | None) -> FaultResult:
    out = FaultResult(fault, EXPECTED[fault])
    old = record(recipe)
    if old is None or pid is None:
        out.detail = f"nothing to kill (server record {'present' if old else 'missing'}, pid {pid})"
        return out
    out.killed_pid = pid
    before = len(_cleaned(recipe))
    os.kill(pid, signal.SIGKILL)
    out.healed_s = wait_healed(recipe, old)
    out.left = dead_session_left(old)
    events = _cleaned(recipe)[before:]
    out.detail = f"supervisor: {events[-1].get('note') if events else 'no cleaned event'}"
    out.passed = out.healed_s is not None and not out.left and bool(events)
    return out


def _cleaned(recipe: Any) -> list[dict[str, Any]]:
    """The supervisor's `cleaned` events so far (each: the old session was empty before the restart)."""
    from trtkv.serving import supervisor_state

    return [e for e in supervisor_state.read_events(recipe, last=10_000) if e.get("event") == "cleaned"]


def fault_supervisor(recipe: Any, spec: list[str]) -> FaultResult:
    from trtkv.serving import health, supervisor_state

    out = FaultResult("supervisor", EXPECTED["supervisor"])
    sup = supervisor_state.alive(recipe)
    if sup is None:
        out.detail = "no supervisor running"
        return out
    out.killed_pid = sup.pid
    start = time.monotonic()
    os.kill(out.killed_pid, signal.SIGKILL)
    while supervisor_state.alive(recipe) is not None and time.monotonic() - start < 10:
        time.sleep(0.1)
    status = trtkv("status", *spec, "--json")
    try:
        doc = json.loads(status.stdout)
    except ValueError:
        doc = {}
    serving = health.check(recipe, canaries=1).state == "healthy"
    attached = trtkv("serve", *spec, "--attach")
    again = supervisor_state.alive(recipe)
    out.healed_s = round(time.monotonic() - start, 1)
    out.detail = (f"status unsupervised={doc.get('unsupervised')}, serving={serving}; attach exit "
                  f"{attached.returncode}: {(attached.stdout or attached.stderr).strip().splitlines()[-1:]}")
    out.passed = bool(doc.get("unsupervised")) and serving and attached.returncode == 0 and again is not None
    return out


def fault_interrupt(recipe: Any, spec: list[str]) -> FaultResult:
    from trtkv.core.process import port_in_use

    out = FaultResult("interrupt", EXPECTED["interrupt"])
    stopped = trtkv("stop", *spec)
    if stopped.returncode != 0:
        out.detail = f"`trtkv stop` failed: {stopped.stderr.strip()[-300:]}"
        return out
    proc = subprocess.Popen([sys.executable, "-m", "trtkv", "serve", *spec], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    started = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        started = record(recipe)
        if started is not None and started.session_id is not None:
            break
        time.sleep(0.1)
    time.sleep(1.0)  # the server is loading its models
    if started is None or proc.poll() is not None:
        proc.kill()
        out.detail = f"the start ended before it could be interrupted (exit {proc.poll()})"
        return out
    out.killed_pid = proc.pid
    proc.send_signal(signal.SIGINT)
    try:
        text, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        text = "did not exit within 60 s of SIGINT"
    out.left = dead_session_left(started, timeout_s=5)
    t = recipe.triton
    taken = [p for p in (t.http_port, t.grpc_port, t.metrics_port) if port_in_use(t.host, p)]
    out.detail = f"exit {proc.returncode}; ports still taken {taken}; last: {text.strip().splitlines()[-1:]}"
    out.passed = proc.returncode != 0 and not out.left and not taken and record(recipe) is None
    return out


def run_matrix(recipe: Any, spec: list[str], faults: list[str], log: Any = print) -> list[FaultResult]:
    """Each fault in ORDER on the running supervised server; `spec`: the recipe name and its overrides."""
    results = []
    for fault in [f for f in ORDER if f in faults]:
        log(f"fault {fault}: {EXPECTED[fault]}")
        if fault in ("main", "child"):
            info = record(recipe)
            pid = None if info is None else info.pid if fault == "main" else child_pid(info)
            result = _restart_fault(recipe, fault, pid)
        elif fault == "supervisor":
            result = fault_supervisor(recipe, spec)
        else:
            result = fault_interrupt(recipe, spec)
        log(f"fault {fault}: {'PASSED' if result.passed else 'FAILED'} (healed in {result.healed_s} s, killed pid "
            f"{result.killed_pid}, left {result.left}; {result.detail})")
        results.append(result)
    return results


def parse_faults(text: str) -> list[str]:
    faults = ORDER if text == "all" else [] if text == "none" else [f.strip() for f in text.split(",") if f.strip()]
    unknown = sorted(set(faults) - set(ORDER))
    if unknown:
        raise SystemExit(f"--faults: unknown {unknown}; allowed: {', '.join(ORDER)}, all, none")
    return list(faults)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recipe")
    ap.add_argument("overrides", nargs="*", help="recipe overrides (section.key=value)")
    ap.add_argument("--faults", default="all", help=f"comma-separated of {', '.join(ORDER)} (default all)")
    ap.add_argument("--output", type=Path, default=None, help="JSON results")
    args = ap.parse_args(argv)
    faults = parse_faults(args.faults)
    sys.path.insert(0, str(ROOT))
    from trtkv.core.process import free_ports
    from trtkv.recipe import load_recipe

    http, grpc, metrics = free_ports(3)
    spec = [args.recipe, *args.overrides, f"triton.http_port={http}", f"triton.grpc_port={grpc}",
            f"triton.metrics_port={metrics}"]
    recipe = load_recipe(spec[0], spec[1:])
    started = trtkv("serve", *spec)
    print(started.stdout.strip() or started.stderr.strip())
    if started.returncode != 0:
        return 2
    first = record(recipe)
    try:
        results = run_matrix(recipe, spec, faults)
    finally:
        said, left, named = stop_and_list_left(spec, [first, record(recipe)])
        print(said)
    results.append(FaultResult("stop", STOPPED, passed=not left, left=left, detail="; ".join(named) or "none left"))
    from trtkv.core.process import port_in_use

    t = recipe.triton
    taken = [p for p in (t.http_port, t.grpc_port, t.metrics_port) if port_in_use(t.host, p)]
    results.append(FaultResult("ports", "after `trtkv stop`: every port is free", passed=not taken,
                               detail=f"still taken: {taken}"))
    if args.output:
        args.output.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
