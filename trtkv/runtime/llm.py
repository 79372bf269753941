"""The slice of TensorRT-LLM's LLM API that trtkv's Triton `llmapi` model uses, on the CPU reference
engine.

`LLM(model=HF_DIR, **llm_args)` loads the HF checkpoint with `ReferenceRuntime.load_hf` (FP8 weights
dequantized, the KV cache stored in FP8 with scale 1.0 as TensorRT-LLM's PyTorch backend stores it);
`generate_async(prompt, SamplingParams(...), streaming=...)` returns a `RequestOutput` that is
awaited (`aresult()`), iterated (`async for`, one snapshot per new token, `outputs[0].text_diff`
holding the new text) or read synchronously (`result()`). `abort()` stops it at the next token. The
names and meanings follow `tensorrt_llm.LLM`, `SamplingParams`, `RequestOutput` and
`CompletionOutput`, so the same model.py drives either engine. The request side (SamplingParams,
RequestOutput, CompletionOutput) is trtkv.runtime.llm_request; LLM and SamplingParams are read from
here.

Requests are batched in flight as TensorRT-LLM batches them (trtkv.runtime.batch.Batcher: up to
max_batch_size sequences in one running batch, joining and leaving at every step; long prompts
prefilled in max_num_tokens chunks when enable_chunked_prefill). What differs from TensorRT-LLM, on
purpose and visibly: no paged KV blocks, computation is float32 with FP8 weights dequantized
(activations not quantized), there is one output per request (`n` 1, no beam search),
`kv_cache_config.max_attention_window` is checked against the model's own per-layer windows (the
only ones its cache keeps) rather than applied, and LLM() arguments that only size or place GPU work
(`tensor_parallel_size`, `kv_cache_config.free_gpu_memory_fraction`, ...) are accepted and listed
in `LLM.ignored_args`. `kv_cache_config.enable_block_reuse` and `host_cache_size` are applied:
trtkv.runtime.block_reuse, a device tier of the served pool's bytes and a host tier of that size.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trtkv.runtime.batch import Batcher, SequenceState, make_sequence
from trtkv.runtime.errors import RequestError

# the llmapi model reads .SamplingParams
from trtkv.runtime.llm_request import RequestOutput, SamplingParams, Snapshot

KV_DTYPES = ("auto", "fp8")
# kv_cache_config fields the reference engine applies: dtype, and max_attention_window checked
# against the model's own per-layer windows (the windows its cache keeps:
# trtkv.kvcache.cache.config_layer_windows)
APPLIED_KV_ARGS = ("dtype", "max_attention_window", "enable_block_reuse", "host_cache_size")
DEFAULT_MAX_BATCH_SIZE = 2048  # TensorRT-LLM's BaseLlmArgs default


class LLM:
    """tensorrt_llm.LLM's constructor and generate API over trtkv's reference engine (see the module
    docstring)."""

    def __init__(
        self,
        model: str | Path,
        tokenizer: str | Path | None = None,
        *,
        backend: str | None = "pytorch",
        max_seq_len: int | None = None,
        max_num_tokens: int | None = None,
        max_batch_size: int | None = None,
        enable_chunked_prefill: bool = False,
        kv_cache_config: Any = None,
        threads: int | None = None,
        **other: Any,
    ) -> None:
        from trtkv.runtime.engine import ReferenceRuntime

        if backend not in (None, "pytorch"):
            raise RequestError(
                f"LLM(backend={backend!r}): the reference engine stands in for the pytorch backend."
            )
        kv = _kv_dict(kv_cache_config)
        kv_dtype = str(kv.get("dtype") or "auto")
        if kv_dtype not in KV_DTYPES:
            raise RequestError(
                f"kv_cache_config.dtype {kv_dtype!r}: the reference engine runs "
                f"{', '.join(KV_DTYPES)} (nvfp4 needs a Blackwell GPU and TensorRT-LLM)."
            )
        self.runtime = ReferenceRuntime.load_hf(
            Path(model),
            threads=threads,
            kv_dtype=kv_dtype,
            max_seq_len=max_seq_len,
            max_num_tokens=max_num_tokens,
            enable_chunked_prefill=enable_chunked_prefill,
        )
        if tokenizer is not None:
            from transformers import AutoTokenizer

            self.runtime.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
        self.tokenizer = self.runtime.tokenizer
        self.max_batch_size = max_batch_size or DEFAULT_MAX_BATCH_SIZE
        if kv.get("max_attention_window") is not None:
            check_attention_windows(self.runtime, kv["max_attention_window"], Path(model))
        self.ignored_args = sorted(
            [*other, *(f"kv_cache_config.{k}" for k in kv if k not in APPLIED_KV_ARGS)]
        )
        self._ids = itertools.count()
        # KvCacheConfig.enable_block_reuse (TensorRT-LLM's default True) and host_cache_size
        # (bytes of the secondary tier): trtkv.runtime.block_reuse
        from trtkv.runtime.block_reuse import pool_bytes, served_pool

        self.prefix_cache, self.prefix_cache_line = served_pool(
            self.runtime,
            bool(kv.get("enable_block_reuse", True)),
            pool_bytes(self.runtime, min(self.max_batch_size, DEFAULT_MAX_BATCH_SIZE)),
            int(kv.get("host_cache_size") or 0),
        )
        self._batcher = Batcher(self.runtime, self.max_batch_size, prefix_cache=self.prefix_cache)

    # -- API
    def generate_async(
        self,
        inputs: str | Sequence[int],
        sampling_params: SamplingParams | None = None,
        streaming: bool = False,
    ) -> RequestOutput:
        params = sampling_params or SamplingParams()
        if int(params.max_tokens) < 1:
            raise RequestError(f"max_tokens {params.max_tokens}: must be >= 1.")
        if params.n != 1 or (params.best_of or 1) != 1:
            raise RequestError(
                f"n={params.n}, best_of={params.best_of}: the reference engine returns one "
                "sequence per request."
            )
        if isinstance(inputs, str):
            ids = list(self.tokenizer.encode(inputs, add_special_tokens=params.add_special_tokens))
            prompt: str | None = inputs
        else:
            ids, prompt = [int(t) for t in inputs], None
        out = RequestOutput(next(self._ids), prompt, ids, params, streaming)
        self._batcher.submit(self._sequence(out, params))
        return out

    def generate(
        self, inputs: str | Sequence[int] | list[str], sampling_params: SamplingParams | None = None
    ) -> RequestOutput | list[RequestOutput]:
        if isinstance(inputs, list) and inputs and isinstance(inputs[0], str):
            return [self.generate_async(p, sampling_params).result() for p in inputs]
        return self.generate_async(inputs, sampling_params).result()  # type: ignore[arg-type]

    def shutdown(self) -> None:
        self._batcher.shutdown()

    # -- one request as a sequence of the running batch
    def _sequence(self, out: RequestOutput, p: SamplingParams) -> SequenceState:
        from trtkv.runtime.sampling import LogitControls

        stops, stop_ids = p.stops(), set(p.stop_token_ids or [])
        prefix = "" if p.exclude_input_from_output or out.prompt is None else out.prompt
        generated: list[int] = []
        state: dict[str, Any] = {"text": "", "reason": None, "stop": None}
        max_tokens = max(
            1, min(int(p.max_tokens), self.runtime.max_seq_len - len(out.prompt_token_ids))
        )

        def on_token(token: int) -> bool:
            # started: abort() now stops it at the next token instead of answering it itself
            out._take()
            if token in stop_ids:
                state.update(reason="stop", stop=token)
                return False
            generated.append(token)
            text = self.tokenizer.decode(generated, skip_special_tokens=True)
            for stop in stops:
                at = text.find(stop)
                if at >= 0:
                    state.update(
                        text=prefix
                        + text[: at + (len(stop) if p.include_stop_str_in_output else 0)],
                        reason="stop",
                        stop=stop,
                    )
                    return False
            if out.aborted():
                state.update(text=prefix + text, reason="cancelled")
                return False
            shown = prefix + _stable_prefix(text, stops)
            # the final response carries the last token (no empty one after it)
            last = len(generated) >= max_tokens
            if out.streaming and not last and len(shown) > len(state["text"]):
                out._publish(Snapshot(shown, tuple(generated), None, None))
            state["text"] = shown
            return True

        def on_done(_tokens: list[int], error: BaseException | None) -> None:
            if out._done.is_set():  # abort() answered it while it was queued
                return
            if error is not None:
                last = out._last
                out._publish(
                    Snapshot(
                        last.text if last else "",
                        last.token_ids if last else (),
                        None,
                        None,
                        error=error,
                    )
                )
                return
            if state["reason"] is None:
                state["text"] = prefix + self.tokenizer.decode(generated, skip_special_tokens=True)
                state["reason"] = (
                    "cancelled"
                    if out.aborted() and len(generated) < max_tokens
                    else "length"
                    if len(generated) >= max_tokens
                    else "stop"
                )
            out._publish(Snapshot(state["text"], tuple(generated), state["reason"], state["stop"]))

        controls = LogitControls(
            repetition_penalty=p.repetition_penalty or 1.0,
            presence_penalty=p.presence_penalty or 0.0,
            frequency_penalty=p.frequency_penalty or 0.0,
            min_tokens=p.min_tokens or 0,
        )
        return make_sequence(
            self.runtime,
            out.prompt_token_ids,
            max_tokens=max_tokens,
            temperature=1.0 if p.temperature is None else float(p.temperature),
            top_k=int(p.top_k or 0),
            top_p=1.0 if p.top_p is None else float(p.top_p),
            seed=p.seed,
            end_id=p.end_id,
            on_token=on_token,
            controls=controls if controls.active else None,
            cancelled=out.aborted,
            on_done=on_done,
        )


def check_attention_windows(runtime: Any, windows: Any, model: Path) -> None:
    """kv_cache_config.max_attention_window, repeated over the layers and capped at max_seq_len as
    TensorRT-LLM reads it, must be the model's own windows (config.json layer_types +
    sliding_window, full layers max_seq_len): those are the windows the reference engine's cache
    keeps; it cannot shorten or lengthen one."""
    from trtkv.kvcache.cache import config_layer_windows

    seq = int(runtime.max_seq_len)
    if (
        not isinstance(windows, (list, tuple))
        or not windows
        or not all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in windows)
    ):
        raise RequestError(
            f"kv_cache_config.max_attention_window {windows!r}: a non-empty list of positive "
            "integers (one window per layer, repeated over the layers)."
        )
    own = [min(w, seq) if w else seq for w in config_layer_windows(runtime.config)]
    asked = [min(int(windows[i % len(windows)]), seq) for i in range(len(own))]
    if asked != own:
        raise RequestError(
            f"kv_cache_config.max_attention_window {list(windows)} gives per layer {asked}, but "
            f"{model / 'config.json'} (layer_types, sliding_window) gives {own} at max_seq_len "
            f"{seq}: the reference engine keeps each layer's own window only. Next: regenerate "
            "model.yaml (`trtkv repo RECIPE --force`), or remove max_attention_window."
        )


def _kv_dict(kv_cache_config: Any) -> dict[str, Any]:
    """kv_cache_config as a dict (a mapping, a KvCacheConfig-like object, or None)."""
    if kv_cache_config is None:
        return {}
    if isinstance(kv_cache_config, dict):
        return dict(kv_cache_config)
    dump = getattr(kv_cache_config, "model_dump", None)
    return dict(dump(exclude_unset=True)) if callable(dump) else dict(vars(kv_cache_config))


def _stable_prefix(text: str, stops: list[str]) -> str:
    """What may be streamed now: no trailing U+FFFD (half a UTF-8 character) and no tail that could
    still become a stop string."""
    cut = len(text)
    while cut and text[cut - 1] == "\ufffd":
        cut -= 1
    for stop in stops:
        for n in range(min(len(stop) - 1, cut), 0, -1):
            if text[:cut].endswith(stop[:n]):
                cut -= n
                break
    return text[:cut]
