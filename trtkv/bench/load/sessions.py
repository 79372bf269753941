"""The prefix-sharing workload (`bench.prefix`): sessions whose first prompt opens with their prefix
group's shared system prompt, multi-turn history built from the answers received, think time
between turns; run as a closed loop over the level's concurrency slots.

After AIPerf's `--shared-system-prompt-length` / `--num-prefix-prompts` / `--conversation-turn-*`
(a session holds its slot while it thinks, as AIPerf's closed loop does) and vLLM's
prefix_repetition dataset. Text is cut from the packaged evaluation text, as the latency prompts
are, and is the same for the same recipe (no randomness: group g's prefix and session s's suffix
are fixed stretches of the text). The shared prefixes come from the text's second half, so the
warm-up's plain prompts (its start) share none of their blocks.

Every request is a RequestRecord with `turn` (1 = a session's first) and `prefix_group`; a level
sends `bench.num_requests` requests (turns count), each bounded by request_timeout_s.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trtkv.bench.load.loadgen import Interrupted, SessionPool
from trtkv.bench.load.prompts import cut_to_tokens, long_text, prompt_tokens
from trtkv.bench.transport.client import SamplingParams
from trtkv.contracts.bench_doc import ERROR, RequestRecord, now_ns
from trtkv.core.errors import StageError

# the groups' shared prefixes and the sessions' own text are cut from this many stretches at most
MAX_STRETCHES = 1024


@dataclass
class SessionPlan:
    """One session: its prefix group, its first prompt (exactly input_tokens tokens, the group's
    prefix first) and the new user text of each later turn."""

    index: int
    group: int
    first_prompt: str
    turn_texts: list[str]


@dataclass
class Workload:
    """What a level sends: the sessions (more than needed, cycled per level) and their lengths."""

    sessions: list[SessionPlan]
    turns: int
    output_tokens: int
    think_time_s: float


def _stretches(tokenizer: Any, ids: list[int], start: int, n_tokens: int, count: int) -> list[str]:
    """`count` texts of about n_tokens tokens from consecutive stretches of `ids` from `start` on
    (wrapping)."""
    out = []
    span = max(1, len(ids) - n_tokens - 8)
    for k in range(count):
        a = (start + k * (n_tokens + 8)) % span
        out.append(tokenizer.decode(ids[a : a + n_tokens], skip_special_tokens=True).strip())
    return out


def plan_workload(tokenizer: Any, bench: Any, sessions: int) -> Workload:
    """`sessions` sessions of bench.prefix's workload (at most MAX_STRETCHES)."""
    p = bench.prefix
    sessions = max(1, min(sessions, MAX_STRETCHES))
    ids = tokenizer.encode(long_text(), add_special_tokens=False)
    half = len(ids) // 2
    prefixes = [""] * p.groups
    if p.shared_tokens:
        texts = _stretches(tokenizer, ids, half, p.shared_tokens + 16, min(p.groups, MAX_STRETCHES))
        prefixes = [
            _shared_prefix(tokenizer, texts[g % len(texts)], p.shared_tokens)
            for g in range(p.groups)
        ]
    rest = bench.input_tokens - p.shared_tokens
    own = _stretches(tokenizer, ids, half // 2, rest + 16, sessions)
    turns = _stretches(tokenizer, ids, 0, p.turn_tokens, max(1, min(64, p.turns - 1)))
    plans = []
    for s in range(sessions):
        group = s % p.groups
        first = _exact(tokenizer, prefixes[group], own[s], bench.input_tokens)
        texts = [turns[(s + t) % len(turns)] for t in range(p.turns - 1)]
        plans.append(SessionPlan(s, group, first, texts))
    return Workload(plans, p.turns, bench.output_tokens, p.think_time_s)


def _head(tokenizer: Any, prefix: str) -> list[int]:
    """The tokens a shared prefix (ending in a blank line) has at the start of a prompt: its blank
    line followed by text encodes otherwise than at the end of a string."""
    return list(tokenizer.encode(prefix + PROBE, add_special_tokens=True))[:-1]


PROBE = "The"  # one token after a blank line in the tokenizers seen (SmolLM2, Llama 3)


def _shared_prefix(tokenizer: Any, text: str, n_tokens: int) -> str:
    """A stretch of `text` ending in a blank line whose tokens at a prompt's start are exactly
    n_tokens (the blank line keeps its tokens apart from the session's own text)."""
    for k in (n_tokens - 2, n_tokens - 1, n_tokens - 3, n_tokens):
        if k < 1:
            continue
        try:
            candidate = cut_to_tokens(tokenizer, text, k).rstrip() + "\n\n"
        except StageError:
            continue
        if len(_head(tokenizer, candidate)) == n_tokens:
            return candidate
    raise StageError(
        f"bench.prefix: could not cut a shared prefix of exactly {n_tokens} tokens. Next: change "
        "bench.prefix.shared_tokens by a few tokens."
    )


def _exact(tokenizer: Any, prefix: str, text: str, n_tokens: int) -> str:
    """prefix + the start of `text`: exactly n_tokens tokens (the server's count, special tokens
    included), the prefix's own tokens unchanged at its start."""
    if not prefix:
        return cut_to_tokens(tokenizer, text, n_tokens)
    head = _head(tokenizer, prefix)
    ids = tokenizer.encode(text, add_special_tokens=False)
    for k in range(max(0, n_tokens - len(head) - 3), min(len(ids), n_tokens - len(head) + 4)):
        candidate = prefix + tokenizer.decode(ids[:k], skip_special_tokens=True).lstrip()
        full = tokenizer.encode(candidate, add_special_tokens=True)
        if len(full) == n_tokens and full[: len(head)] == head:
            return candidate
    raise StageError(
        f"bench.prefix: could not cut a first prompt of exactly {n_tokens} tokens that keeps the "
        "shared prefix's tokens. Next: change bench.input_tokens or bench.prefix.shared_tokens by "
        "a few tokens."
    )


def run_sessions(
    pool: SessionPool,
    work: Workload,
    tokenizer: Any,
    level: str,
    concurrency: int,
    requests: int,
    timeout_s: float,
    on_done: Callable[[RequestRecord], None] = lambda r: None,
) -> list[RequestRecord]:
    """Closed loop: `concurrency` slots, each running whole sessions one after another (a session
    keeps its slot through its turns and think time), until `requests` requests were sent."""
    todo: queue.SimpleQueue[SessionPlan] = queue.SimpleQueue()
    needed = -(-requests // work.turns)
    for k in range(needed):
        todo.put(work.sessions[k % len(work.sessions)])
    records: list[RequestRecord] = []
    lock, stop = threading.Lock(), threading.Event()

    def claim(plan: SessionPlan, turn: int, prompt: str) -> RequestRecord | None:
        with lock:
            if len(records) >= requests or stop.is_set():
                return None
            rec = RequestRecord(
                f"{level}-latency-{len(records)}",
                "latency",
                level,
                plan.index,
                prompt_tokens(tokenizer, prompt),
                work.output_tokens,
            )
            rec.turn, rec.prefix_group = turn, plan.group
            records.append(rec)
            return rec

    def slot() -> None:
        session = pool.borrow()
        try:
            while not stop.is_set():
                try:
                    plan = todo.get_nowait()
                except queue.Empty:
                    return
                _run_session(session, plan, work, claim, timeout_s, on_done, stop)
        finally:
            pool.give_back(session)

    threads = [
        threading.Thread(target=slot, daemon=True, name=f"bench-session-{i}")
        for i in range(concurrency)
    ]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.2)
    except KeyboardInterrupt:
        stop.set()
        for t in threads:
            t.join(timeout_s)
        raise Interrupted(list(records)) from None
    return records


def _run_session(
    session: Any,
    plan: SessionPlan,
    work: Workload,
    claim: Callable[[SessionPlan, int, str], RequestRecord | None],
    timeout_s: float,
    on_done: Callable[[RequestRecord], None],
    stop: threading.Event,
) -> None:
    """A session's turns: each later one sends the history (the previous prompt and the answer it
    got) plus its new text, after the think time; a failed turn ends the session."""
    prompt, answer = plan.first_prompt, ""
    for turn in range(1, work.turns + 1):
        if turn > 1:
            if work.think_time_s and stop.wait(work.think_time_s):
                return
            prompt = f"{prompt}{answer}\n\n{plan.turn_texts[turn - 2]}"
        rec = claim(plan, turn, prompt)
        if rec is None:
            return
        if session is None:
            rec.status, rec.error, rec.end_ns = ERROR, "could not open a session", now_ns()
        else:
            try:
                session.run(rec, prompt, SamplingParams(max_tokens=work.output_tokens), timeout_s)
            except Exception as exc:  # noqa: BLE001 - counted as a failed request, never dropped
                rec.status, rec.error, rec.end_ns = ERROR, f"{type(exc).__name__}: {exc}", now_ns()
        on_done(rec)
        if not rec.ok:
            return
        answer = rec.text


def group_summary(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """Requests per turn and per prefix group, and each turn's TTFT median (ms): the shape a
    prefix cache gives (later turns and repeated prefixes start faster)."""
    import statistics

    by_turn: dict[int, list[float]] = {}
    groups: dict[int, int] = {}
    for r in records:
        if r.turn is None or not r.ok:
            continue
        # the first response with text (tokens are counted later, over the whole run)
        first = next((i for i, t in enumerate(r.response_texts) if t), None)
        if first is not None and first < len(r.response_ns):
            by_turn.setdefault(r.turn, []).append((r.response_ns[first] - r.send_ns) / 1e6)
        if r.prefix_group is not None:
            groups[r.prefix_group] = groups.get(r.prefix_group, 0) + 1
    return {
        "requests_per_turn": {t: len(v) for t, v in sorted(by_turn.items())},
        "ttft_ms_p50_per_turn": {t: statistics.median(v) for t, v in sorted(by_turn.items())},
        "requests_per_group": dict(sorted(groups.items())),
    }
