"""A request to trtkv.runtime.llm's LLM, shaped as TensorRT-LLM's: `SamplingParams` (what it asks,
same names and defaults as `tensorrt_llm.SamplingParams`), and the `RequestOutput` that
generate_async returns: awaited (`aresult()`), iterated (`async for`, one snapshot per update) or
read synchronously (`result()`), with its `CompletionOutput` (`text_diff`/`token_ids_diff` since the
previous snapshot). The engine's worker thread publishes snapshots; `abort()` stops the request at
the next token, or ends a queued one at once.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass, field

from trtkv.runtime.errors import RequestError


@dataclass
class SamplingParams:
    """tensorrt_llm.SamplingParams, the fields the reference engine supports (same names, same
    defaults)."""

    max_tokens: int = 32
    temperature: float | None = None  # None: TensorRT-LLM's default, 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    end_id: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    min_tokens: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    add_special_tokens: bool = True
    exclude_input_from_output: bool = True  # False: text_output starts with the prompt
    # accepted; the reference engine has no per-request KV/timing metrics
    return_perf_metrics: bool = False
    best_of: int | None = None
    n: int = 1

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [s for s in ([self.stop] if isinstance(self.stop, str) else self.stop) if s]


@dataclass
class CompletionOutput:
    """One generated sequence; `text_diff`/`token_ids_diff` are what arrived since the previous
    snapshot."""

    index: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length" | "cancelled" | None while running
    stop_reason: int | str | None = None
    cumulative_logprob: float | None = None  # not computed by the reference engine
    _last_text_len: int = 0
    _last_ids_len: int = 0

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def text_diff(self) -> str:
        return self.text[self._last_text_len :]

    @property
    def token_ids_diff(self) -> list[int]:
        return self.token_ids[self._last_ids_len :]


@dataclass(frozen=True)
class Snapshot:
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None
    stop_reason: int | str | None
    error: BaseException | None = None

    @property
    def final(self) -> bool:
        return self.finish_reason is not None or self.error is not None


class RequestOutput:
    """A request in flight: `async for` yields it once per update (streaming),
    `aresult()`/`result()` the end."""

    def __init__(
        self,
        request_id: int,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        streaming: bool,
    ) -> None:
        self.request_id, self.prompt, self.prompt_token_ids = request_id, prompt, prompt_token_ids
        self.sampling_params, self.streaming = params, streaming
        self.outputs = [CompletionOutput()]
        self.finished = False
        self._aborted = threading.Event()
        self._done = threading.Event()
        self._lock = threading.Lock()
        # the worker took it (under _lock: abort() answers a queued request itself)
        self._started = False
        self._sync: queue.SimpleQueue[Snapshot] = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._async: asyncio.Queue[Snapshot] | None = None
        try:
            self._loop = asyncio.get_running_loop()
            self._async = asyncio.Queue()
        except RuntimeError:  # called outside an event loop: result() and plain iteration work
            pass
        self._last: Snapshot | None = None

    # -- producer side (the engine's worker thread)
    def _publish(self, snap: Snapshot) -> None:
        with self._lock:
            self._last = snap
        if self._loop is not None and self._async is not None:
            try:
                self._loop.call_soon_threadsafe(self._async.put_nowait, snap)
            # the consumer's loop is closed: nobody reads this request any more
            except RuntimeError:
                self._aborted.set()
        else:
            self._sync.put(snap)
        if snap.final:
            self._done.set()

    # -- consumer side
    def _apply(self, snap: Snapshot) -> RequestOutput:
        out = self.outputs[0]
        out._last_text_len, out._last_ids_len = len(out.text), len(out.token_ids)
        out.text, out.token_ids = snap.text, list(snap.token_ids)
        out.finish_reason, out.stop_reason = snap.finish_reason, snap.stop_reason
        self.finished = snap.final
        if snap.error is not None:
            raise snap.error
        return self

    def abort(self) -> None:
        """Stop generating at the next token (finish_reason "cancelled"); a request still queued
        ends at once."""
        with self._lock:
            self._aborted.set()
            queued = not self._started and not self._done.is_set()
            self._started = True  # the worker will skip it
        if queued:
            self._publish(Snapshot("", (), "cancelled", None))

    def _take(self) -> bool:
        """The worker's claim on the request: False when abort() already ended it."""
        with self._lock:
            if self._started:
                return False
            self._started = True
            return True

    def aborted(self) -> bool:
        return self._aborted.is_set()

    def __aiter__(self) -> RequestOutput:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        if self._async is None:
            raise RuntimeError("generate_async was called outside an event loop: use result()")
        snap = await self._async.get()
        if not self.streaming:  # one item: the final state
            while not snap.final:
                snap = await self._async.get()
        return self._apply(snap)

    async def aresult(self) -> RequestOutput:
        async for _ in self:
            pass
        return self

    def result(self, timeout: float | None = None) -> RequestOutput:
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.request_id} not finished within {timeout} s")
        with self._lock:
            last = self._last
        # _done is set only after a snapshot was stored; reaching here is a bug in this module
        if last is None:
            raise RequestError(
                f"request {self.request_id} ended without an output. Next: report it with the "
                "server log; the request can be sent again."
            )
        return self._apply(last)
