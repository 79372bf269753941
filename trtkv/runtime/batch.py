"""In-flight batching for the reference runtime: requests join and leave one running batch at each
decode step.

A `SequenceState` is one request's state (its own KV cache in the engine's quantized format, its
sampling settings, the tokens so far). `decode_step` runs one batched forward pass for several
sequences that each feed one token: the projections, MLPs, norms and the LM head run once on the
whole batch (the weights are read once per step, which is what makes batching pay on a memory-bound
CPU or GPU); RoPE uses each sequence's own position, and attention runs per sequence against its own
cache (no padding, no paged blocks). Prefill runs per sequence through the model's own forward, in
chunks of at most max_num_tokens.

`Batcher` is the scheduler: a thread that admits queued requests up to max_batch_size, prefills each
newcomer (one chunk per iteration, so decoding sequences keep streaming while a long prompt is
prefilled), then advances every decoding sequence by one token. A finished or cancelled sequence
leaves the batch at once and frees its slot. By default (`runtime.batch_invariant`) every step runs
through trtkv.runtime.invariant (16-row prefill panels, fixed 8-row decode blocks, padded-key flash
or tile attention): greedy answers equal solo answers bit for bit, whatever shares the steps and
however a prompt is chunked (tests/runtime/test_batch_invariance.py). With it off (runtime.json
`batch_invariant: false`, TRTKV_BATCH_INVARIANT=0) the plain path below runs: outputs equal a solo
run's only up to float32 GEMM rounding, which depends on the batch size, so a near-tie can flip
under load.
"""

from __future__ import annotations

import collections
import threading
import traceback
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trtkv.runtime.errors import RequestError
from trtkv.runtime.sampling import LogitControls, ends_with, pick_token

if TYPE_CHECKING:
    import torch

# trtkv.runtime.engine.ReferenceRuntime (model, new_cache, check_request, prefill_chunk,
# max_seq_len, eos_token_ids); not imported here, not even for types: the engine imports this module
ReferenceRuntime = Any


@dataclass
class SequenceState:
    """One request in the engine: prompt, sampling settings, callbacks and its own KV cache."""

    prompt: list[int]
    max_tokens: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    ends: set[int] = field(default_factory=set)
    stops: list[list[int]] = field(default_factory=list)
    controls: LogitControls | None = None
    log_probs: list[float] | None = None
    on_token: Callable[[int], bool | None] | None = None  # False: cancel
    cancelled: Callable[[], bool] | None = None  # polled while queued and between prefill chunks
    on_done: Callable[[list[int], BaseException | None], None] | None = None
    # state
    out: list[int] = field(default_factory=list)
    cache: Any = None
    prefilled: int = 0  # prompt tokens already in the cache
    last: int | None = None  # the token to feed next
    done: bool = False
    generator: Any = None
    # prefix cache (trtkv.runtime.block_reuse): prompt tokens copied from cached blocks, and the
    # blocks' keys this sequence references until it finishes
    reused_tokens: int = 0
    reused_keys: list[bytes] = field(default_factory=list)

    def start(self, runtime: ReferenceRuntime) -> None:
        import torch

        self.cache = runtime.new_cache()
        self.generator = torch.Generator()
        if self.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(int(self.seed))

    def accept(self, logits: torch.Tensor) -> None:
        """Choose the next token from `logits` (the last position's), emit it, and mark the end when
        reached."""
        import torch

        scale = self.temperature
        seq = self.prompt + self.out
        c = self.controls
        # TensorRT-LLM's penalty kernel: bias, then 1/temperature, then the penalties
        if c is not None and c.active:
            logits = c.add_bias(logits)
            if self.temperature > 0:
                logits, scale = logits / self.temperature, 1.0
            logits = c.apply(logits, seq, len(self.out), self.ends)
        token = pick_token(logits, scale, self.top_k, self.top_p, self.generator)
        if token in self.ends:
            self.done = True
            return
        if self.log_probs is not None:
            self.log_probs.append(float(torch.log_softmax(logits.float(), dim=-1)[token]))
        self.out.append(token)
        self.last = token
        if self.on_token is not None and self.on_token(token) is False:
            self.done = True
        elif len(self.out) >= self.max_tokens or ends_with(self.out, self.stops):
            self.done = True

    def is_cancelled(self) -> bool:
        return self.cancelled is not None and bool(self.cancelled())


def make_sequence(
    runtime: ReferenceRuntime,
    input_ids: Seq[int],
    *,
    max_tokens: int,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    end_id: int | None = None,
    stop_words: Seq[Seq[int]] | None = None,
    on_token: Callable[[int], bool | None] | None = None,
    controls: LogitControls | None = None,
    log_probs: list[float] | None = None,
    cancelled: Callable[[], bool] | None = None,
    on_done: Callable[[list[int], BaseException | None], None] | None = None,
) -> SequenceState:
    """A checked SequenceState with ReferenceRuntime.generate's arguments (RequestError on a bad
    request)."""
    runtime.check_request(input_ids, max_tokens, temperature, top_k, top_p)
    if controls is not None and controls.min_tokens > max_tokens:
        raise RequestError(f"min_tokens {controls.min_tokens} exceeds max_tokens {max_tokens}.")
    return SequenceState(
        prompt=[int(t) for t in input_ids],
        max_tokens=min(max_tokens, runtime.max_seq_len - len(input_ids)),
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        ends={end_id} if end_id is not None else set(runtime.eos_token_ids),
        stops=[list(s) for s in (stop_words or []) if s],
        controls=controls,
        log_probs=log_probs,
        on_token=on_token,
        cancelled=cancelled,
        on_done=on_done,
    )


def prefill_chunk(runtime: ReferenceRuntime, seq: SequenceState, budget: int | None) -> bool:
    """Feed the next at most `budget` prompt tokens (None: all) through the model; on the last chunk
    choose the first token. True when the prompt is fully prefilled."""
    import torch

    rest = len(seq.prompt) - seq.prefilled
    n = rest if budget is None else max(1, min(rest, budget))
    if runtime.batch_invariant:
        return _prefill_chunk_invariant(runtime, seq, n)
    ids = torch.tensor([seq.prompt[seq.prefilled : seq.prefilled + n]], dtype=torch.long)
    with torch.inference_mode():
        out = runtime.model(
            input_ids=ids, past_key_values=seq.cache, use_cache=True, logits_to_keep=1
        )
    seq.prefilled += n
    if seq.prefilled < len(seq.prompt):
        return False
    seq.accept(out.logits[0, -1])
    return True


def decode_step(runtime: ReferenceRuntime, seqs: list[SequenceState]) -> torch.Tensor:
    """One forward pass feeding each sequence's last token; returns the next-token logits, one row
    per sequence."""
    import torch

    if runtime.batch_invariant:
        return _decode_step_invariant(runtime, seqs)
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from trtkv.runtime import gemma3

    model = runtime.model.model
    ids = torch.tensor([[s.last] for s in seqs], dtype=torch.long)
    positions = torch.tensor([[s.cache.get_seq_length()] for s in seqs], dtype=torch.long)
    with torch.inference_mode():
        if gemma3.is_gemma3(runtime.model.config):
            return gemma3.decode_step(runtime.model, seqs, ids, positions)
        h = model.embed_tokens(ids)  # (B, 1, D)
        cos, sin = model.rotary_emb(h, positions)
        batch = len(seqs)
        for i, layer in enumerate(model.layers):
            attn = layer.self_attn
            residual = h
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(batch, 1, -1, attn.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(batch, 1, -1, attn.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(batch, 1, -1, attn.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            h = residual + attn.o_proj(gemma3.attend_each(attn, seqs, i, q, k, v))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        h = model.norm(h)
        return runtime.model.lm_head(h)[:, -1, :]


def _prefill_chunk_invariant(runtime: ReferenceRuntime, seq: SequenceState, n: int) -> bool:
    """prefill_chunk of the next `n` prompt tokens, whose boundaries do not change a token's
    arithmetic."""
    import torch

    from trtkv.runtime import invariant

    with torch.inference_mode():
        last = invariant.prefill_rows(
            runtime.model,
            seq,
            seq.prompt[seq.prefilled : seq.prefilled + n],
            seq.prefilled,
            runtime.max_seq_len,
        )
        seq.prefilled += n
        if seq.prefilled < len(seq.prompt):
            return False
        # a 1-row call: the same shape for any chunking
        logits = invariant.lm_head(runtime.model, last[None])[0]
    seq.accept(logits)
    return True


def _decode_step_invariant(runtime: ReferenceRuntime, seqs: list[SequenceState]) -> torch.Tensor:
    """One forward pass feeding each sequence's last token; returns the next-token logits, one row
    per sequence. Each row is computed by the same fixed-shape calls whatever else is in `seqs`
    (trtkv.runtime.invariant)."""
    import torch

    from trtkv.runtime import invariant

    with torch.inference_mode():
        blocks = invariant.forward_rows(
            runtime.model, invariant.decode_blocks(runtime.model, seqs), runtime.max_seq_len
        )
        return torch.cat([invariant.lm_head(runtime.model, b.x, b.hi)[b.lo : b.hi] for b in blocks])


def run_solo(runtime: ReferenceRuntime, seq: SequenceState) -> list[int]:
    """One sequence start to end (the same prefill and decode code the batcher runs, with a batch of
    one)."""
    seq.start(runtime)
    chunk = runtime.prefill_chunk
    while not prefill_chunk(runtime, seq, chunk):
        pass
    while not seq.done:
        seq.accept(decode_step(runtime, [seq])[0])
    return seq.out


class Batcher:
    """The in-flight batching scheduler (see the module docstring). `submit` returns at once; the
    sequence's callbacks run on the scheduler thread (on_token per token, on_done once, with the
    tokens or the error)."""

    def __init__(
        self,
        runtime: ReferenceRuntime,
        max_batch_size: int,
        max_num_tokens: int | None = None,
        prefix_cache: Any = None,
    ) -> None:
        """`prefix_cache`: a trtkv.runtime.block_reuse.BlockPool (make_pool) whose blocks a new
        request's prompt is served from and a finished request's blocks go to; None: no reuse."""
        if max_batch_size < 1:
            raise RequestError(f"max_batch_size {max_batch_size}: must be >= 1")
        self.runtime, self.max_batch_size = runtime, max_batch_size
        self.prefix_cache = prefix_cache
        self.max_num_tokens = max_num_tokens or runtime.prefill_chunk
        self._queue: collections.deque[SequenceState] = collections.deque()
        self._wake = threading.Condition()
        self._stop = False
        self.steps = 0  # decode steps run
        self.peak_batch = 0  # most sequences in one decode step
        self._thread = threading.Thread(target=self._run, name="trtkv-batcher", daemon=True)
        self._thread.start()

    def submit(self, seq: SequenceState) -> None:
        with self._wake:
            if self._stop:
                raise RequestError("the engine is shutting down")
            self._queue.append(seq)
            self._wake.notify()

    def wait_admitted(self) -> None:
        """Block while submitted requests still wait for a slot in the running batch. A Triton model
        calls it before execute() returns, so Triton sends new requests to an instance with room
        instead of queueing them here."""
        with self._wake:
            while self._queue and not self._stop:
                self._wake.wait()

    def shutdown(self, timeout: float = 30.0) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify()
        self._thread.join(timeout)

    def _finish(self, seq: SequenceState, error: BaseException | None = None) -> None:
        seq.done = True
        pool = self.prefix_cache
        if pool is not None and seq.cache is not None:
            if error is None and seq.prefilled == len(seq.prompt):
                pool.store(seq.prompt + seq.out, seq.cache)  # the answer's full blocks too
            pool.release(seq.reused_keys)
        seq.cache = None  # the slot's memory goes now
        if seq.on_done is not None:
            try:
                seq.on_done(seq.out, error)
            except Exception:  # noqa: BLE001 - a failing callback must not stop the other requests
                traceback.print_exc()

    def _reuse(self, seq: SequenceState) -> None:
        """Copy the cached blocks of the prompt's longest cached prefix into the new sequence's
        cache: prefill then starts after them."""
        if self.prefix_cache is None:
            return
        from trtkv.runtime.block_reuse import empty_like_kv

        tokens, keys = self.prefix_cache.lookup(
            seq.prompt, seq.cache, empty_like_kv(self.runtime.config)
        )
        seq.prefilled = seq.reused_tokens = tokens
        seq.reused_keys = keys

    def _run(self) -> None:
        prefilling: list[SequenceState] = []
        decoding: list[SequenceState] = []
        while True:
            with self._wake:
                while not self._stop and not self._queue and not prefilling and not decoding:
                    self._wake.wait()
                if self._stop:
                    for s in [*self._queue, *prefilling, *decoding]:
                        self._finish(s, RequestError("the engine shut down"))
                    return
                while self._queue and len(prefilling) + len(decoding) < self.max_batch_size:
                    prefilling.append(self._queue.popleft())
                self._wake.notify_all()  # wait_admitted() callers
            self._iterate(prefilling, decoding)

    def _iterate(self, prefilling: list[SequenceState], decoding: list[SequenceState]) -> None:
        # prefill: one chunk of the oldest newcomer, within the step's token budget (decode tokens
        # count too)
        if prefilling:
            seq = prefilling[0]
            try:
                if seq.is_cancelled():
                    prefilling.pop(0)
                    self._finish(seq)
                else:
                    if seq.cache is None:
                        seq.start(self.runtime)
                        self._reuse(seq)
                    budget = (
                        None
                        if self.max_num_tokens is None
                        else max(1, self.max_num_tokens - len(decoding))
                    )
                    if prefill_chunk(self.runtime, seq, budget):
                        if self.prefix_cache is not None:  # later requests may share the prompt
                            self.prefix_cache.store(
                                seq.prompt,
                                seq.cache,
                                seq.reused_tokens // self.prefix_cache.block_tokens,
                            )
                        prefilling.pop(0)
                        if seq.done:
                            self._finish(seq)
                        else:
                            decoding.append(seq)
            except Exception as exc:  # noqa: BLE001 - reported to that request only
                prefilling.pop(0)
                self._finish(seq, exc)
        if not decoding:
            return
        try:
            logits = decode_step(self.runtime, decoding)
        except Exception as exc:  # noqa: BLE001 - a failed step fails the sequences in it, not the engine
            for seq in decoding:
                self._finish(seq, exc)
            decoding.clear()
            return
        self.steps += 1
        self.peak_batch = max(self.peak_batch, len(decoding))
        for seq, row in zip(list(decoding), logits, strict=True):
            try:
                seq.accept(row)
            except Exception as exc:  # noqa: BLE001
                decoding.remove(seq)
                self._finish(seq, exc)
                continue
            if seq.done:
                decoding.remove(seq)
                self._finish(seq)
