"""One request's raw record and the per-request metrics derived from it (GenAI-Perf definitions)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields

from trtkv.contracts.bench_doc import RequestFields, RequestRecordDoc

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
class RequestRecord(RequestFields):
    """A request as the client measures it: its fields (trtkv.contracts.RequestFields), and times
    in ns on the run's monotonic clock (perf_counter_ns minus the run's start)."""

    send_ns: int = 0
    response_ns: list[int] = field(default_factory=list)
    end_ns: int | None = None

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

    def to_doc(self) -> RequestRecordDoc:
        """The raw record as written to results.json (times in ms since the run started)."""
        idx = self.content_indices()
        return RequestRecordDoc(
            **{f.name: getattr(self, f.name) for f in fields(RequestFields)},
            send_time_ms=self.send_ns / 1e6,
            response_times_ms=[t / 1e6 for t in self.response_ns],
            first_token_time_ms=self.response_ns[idx[0]] / 1e6 if idx else None,
            end_time_ms=None if self.end_ns is None else self.end_ns / 1e6,
            output_tokens=self.output_tokens(),
        )

    @classmethod
    def from_doc(cls, doc: RequestRecordDoc) -> RequestRecord:
        """A record read back from results.json, to recompute its figures."""
        return cls(
            **{f.name: getattr(doc, f.name) for f in fields(RequestFields)},
            send_ns=round(doc.send_time_ms * 1e6),
            response_ns=[round(t * 1e6) for t in doc.response_times_ms],
            end_ns=None if doc.end_time_ms is None else round(doc.end_time_ms * 1e6),
        )
