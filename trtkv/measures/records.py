"""One request's raw record and the per-request metrics derived from it (GenAI-Perf definitions)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

# a request's status
OK = "ok"
ERROR = "error"
TIMEOUT = "timeout"
CANCELLED = "cancelled"
NOT_SENT = "not_sent"


def now_ns() -> int:
    """The clock of every *_ns time in a RequestRecord: perf_counter_ns (monotonic, the finest the
    OS gives)."""
    return time.perf_counter_ns()


@dataclass
class RequestRecord:
    """Times are ns on the run's monotonic clock (perf_counter_ns minus the run's start)."""

    request_id: str
    phase: str  # "warmup", "latency", or an accuracy task name
    level: str  # "concurrency=2", "rate=4.0/s", or the task name
    prompt_index: int
    input_tokens: int
    max_tokens: int
    send_ns: int = 0
    response_ns: list[int] = field(default_factory=list)
    response_texts: list[str] = field(default_factory=list)
    response_tokens: list[int] = field(default_factory=list)
    end_ns: int | None = None
    status: str = "pending"
    error: str = ""
    # the client's own CPU time for this request (OpenAI/HTTP sessions; 0 where not measured)
    client_cpu_ns: int = 0
    # output tokens the server reported (OpenAI usage), to compare with the count
    server_tokens: int | None = None
    # sampled reads: the client's own lag (HTTP/OpenAI, Linux)
    client_lag_us: list[int] = field(default_factory=list)
    # the client process that carried it (0: the only one, or the first worker)
    client_worker: int = 0
    # open loop: no worker was free at its send time (perf_analyzer's delayed requests)
    delayed: bool = False
    # the prefix-sharing workload (bench.prefix): the session's turn (1: its first) and its prefix
    # group; None for every other request (and then left out of results.json)
    turn: int | None = None
    prefix_group: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def text(self) -> str:
        return "".join(self.response_texts)

    def content_indices(self) -> list[int]:
        """Responses that carried at least one token (an empty final response carries none)."""
        return [i for i, n in enumerate(self.response_tokens) if n > 0]

    def output_tokens(self) -> int:
        return sum(self.response_tokens)

    def ttft_ms(self) -> float | None:
        idx = self.content_indices()
        return (self.response_ns[idx[0]] - self.send_ns) / 1e6 if idx else None

    def request_latency_ms(self) -> float | None:
        if not self.response_ns:
            return None
        return (self.response_ns[-1] - self.send_ns) / 1e6

    def itl_ms(self) -> float | None:
        """Gaps between content responses, each divided by the tokens in the later one,
        token-weighted per request."""
        idx = self.content_indices()
        if len(idx) < 2:
            return None
        gap_ns = self.response_ns[idx[-1]] - self.response_ns[idx[0]]
        later_tokens = sum(self.response_tokens[i] for i in idx[1:])
        return gap_ns / later_tokens / 1e6

    def to_json(self) -> dict[str, Any]:
        """The raw record as written to results.json (times in ms since the run started)."""
        data = asdict(self)
        data.pop("response_ns")
        data.pop("send_ns")
        data.pop("end_ns")
        data["send_time_ms"] = self.send_ns / 1e6
        data["response_times_ms"] = [t / 1e6 for t in self.response_ns]
        idx = self.content_indices()
        data["first_token_time_ms"] = self.response_ns[idx[0]] / 1e6 if idx else None
        data["end_time_ms"] = None if self.end_ns is None else self.end_ns / 1e6
        data["output_tokens"] = self.output_tokens()
        for name in ("turn", "prefix_group"):
            if data[name] is None:
                data.pop(name)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        rec = cls(
            request_id=data["request_id"],
            phase=data["phase"],
            level=data["level"],
            prompt_index=data["prompt_index"],
            input_tokens=data["input_tokens"],
            max_tokens=data["max_tokens"],
        )
        rec.send_ns = round(data["send_time_ms"] * 1e6)
        rec.response_ns = [round(t * 1e6) for t in data["response_times_ms"]]
        rec.response_texts = list(data["response_texts"])
        rec.response_tokens = list(data["response_tokens"])
        rec.end_ns = None if data.get("end_time_ms") is None else round(data["end_time_ms"] * 1e6)
        rec.status, rec.error = data["status"], data.get("error", "")
        rec.client_cpu_ns, rec.server_tokens = (
            int(data.get("client_cpu_ns") or 0),
            data.get("server_tokens"),
        )
        rec.client_lag_us = [int(v) for v in data.get("client_lag_us") or []]
        rec.client_worker = int(data.get("client_worker") or 0)
        rec.delayed = data.get("delayed") is True
        rec.turn, rec.prefix_group = data.get("turn"), data.get("prefix_group")
        return rec
