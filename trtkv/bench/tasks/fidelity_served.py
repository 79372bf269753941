"""The fidelity task's requests: a greedy continuation with its log-probabilities from the served
endpoint.

Triton (the inflight_batcher_llm ensemble, TensorRT-LLM's names): HTTP `POST
v2/models/<model>/generate` with `return_log_probs: true`, answered with `text_output` and
`output_log_probs` (the chosen tokens' log-probs; no top-k: `generation_logits` need an engine built
with --gather_generation_logits, which the reference runtime refuses). The continuation's token ids
are the tokenizer's ids of `text_output`; a document whose re-tokenized text does not give one id
per log-prob is reported as not aligned and left out. A gRPC endpoint is asked over the same
server's HTTP port (engines/<recipe>/serve/server.json, else the recipe's triton.http_port). OpenAI
(vLLM 0.32 `vllm/entrypoints/openai/completion/protocol.py`): `POST /v1/completions`, the prompt as
token ids, `logprobs: k` and vLLM's `return_tokens_as_token_ids: true`, so
`choices[0].logprobs.tokens` are `token_id:<id>` and `top_logprobs` give the top-k per position
exactly.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from trtkv.bench.tasks.fidelity_score import TOP_K, Served
from trtkv.bench.transport.client import Endpoint
from trtkv.bench.transport.http1 import ProtocolError
from trtkv.bench.transport.http1_fetch import strict
from trtkv.core.errors import TrtkvError
from trtkv.core.httpcall import request
from trtkv.recipe import Recipe
from trtkv.recipe.enums import Protocol

TOKEN_ID_PREFIX = "token_id:"  # vLLM's format_token_id_placeholder
MAX_BODY = 64 << 20


def _post(url: str, path: str, body: dict[str, Any], timeout_s: float) -> tuple[int, Any]:
    """POST `body` to host:port `url`: (status, the answer's JSON, or {"error": ...}); one deadline,
    at most MAX_BODY, read by the bench's strict parser (trtkv.core.httpcall with
    http1_fetch.strict). An answer that breaks the parser's rules or bounds is that document's error
    (status 0); a connection that fails raises OSError."""
    try:
        answer = request(
            f"{url}{path}", body, timeout_s=timeout_s, max_bytes=MAX_BODY, transport=strict(None)
        )
    except ProtocolError as exc:
        return 0, {"error": f"not a well-formed, bounded HTTP answer: {exc}"}
    try:
        return answer.status, json.loads(answer.body) if answer.body else None
    except ValueError:
        return answer.status, {"error": answer.body[:200].decode(errors="replace")}


def _error(status: int, body: Any) -> str | None:
    if status == 200 and isinstance(body, dict) and "error" not in body:
        return None
    err = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(err, dict):
        err = err.get("message", err)
    return f"HTTP {status}: {str(err)[:300]}"


def _failed(prefix: Sequence[int], error: str) -> Served:
    """A request that gave no usable continuation: its prompt ids and why."""
    return Served(list(prefix), [], [], error=error)


def triton_request(
    url: str, model: str, tokenizer: Any, prompt: str, tokens: int, timeout_s: float
) -> Served:
    """One greedy continuation with output_log_probs from Triton's HTTP generate endpoint."""
    prefix = list(tokenizer.encode(prompt, add_special_tokens=True))
    body = {
        "text_input": prompt,
        "max_tokens": tokens,
        "temperature": 0.0,
        "top_k": 1,
        "top_p": 1.0,
        "return_log_probs": True,
        "stream": False,
    }
    status, doc = _post(url, f"/v2/models/{model}/generate", body, timeout_s)
    error = _error(status, doc)
    if error is not None:
        return _failed(prefix, error)
    text = doc.get("text_output")
    text = (text[0] if text else "") if isinstance(text, list) else str(text or "")
    lps = doc.get("output_log_probs")
    if not isinstance(lps, list):
        why = "the response has no output_log_probs (the model does not return them)"
        return _failed(prefix, why)
    flat = [float(x) for x in _flatten(lps)]
    ids = list(tokenizer.encode(text, add_special_tokens=False)) if text else []
    if len(ids) != len(flat):
        return Served(
            prefix,
            ids,
            flat,
            error=f"not aligned: {len(flat)} log-probs, but the text re-tokenizes to "
            f"{len(ids)} tokens",
        )
    return Served(prefix, ids, flat)


def _flatten(values: Any) -> list[Any]:
    if isinstance(values, list):
        return [x for v in values for x in _flatten(v)]
    return [values]


def openai_request(
    url: str, model: str, prefix: Sequence[int], tokens: int, timeout_s: float, k: int = TOP_K
) -> Served:
    """One greedy continuation with logprobs and top_logprobs from /v1/completions (prompt sent as
    token ids)."""
    body = {
        "model": model,
        "prompt": list(prefix),
        "max_tokens": tokens,
        "temperature": 0.0,
        "top_p": 1.0,
        "logprobs": k,
        "return_tokens_as_token_ids": True,
        "stream": False,
    }
    status, doc = _post(url, "/v1/completions", body, timeout_s)
    error = _error(status, doc)
    if error is not None:
        return _failed(prefix, error)
    try:
        lp = doc["choices"][0]["logprobs"]
        ids = [_token_id(t) for t in lp["tokens"]]
        chosen = [float(x) for x in lp["token_logprobs"]]
        top = [
            {_token_id(t): float(v) for t, v in (row or {}).items()} for row in lp["top_logprobs"]
        ]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        return _failed(
            prefix,
            f"no usable logprobs in the answer ({type(exc).__name__}: {exc}); "
            "the server must support logprobs and return_tokens_as_token_ids",
        )
    if not (len(ids) == len(chosen) == len(top)):
        return _failed(prefix, "logprobs: tokens, token_logprobs and top_logprobs differ in length")
    return Served(list(prefix), ids, chosen, top)


def openai_prompt_logprobs(
    url: str, model: str, ids: Sequence[int], timeout_s: float
) -> tuple[list[float] | None, str | None]:
    """The engine's own prefill log-probabilities of ids[1:] (vLLM: `echo` with `max_tokens` 0 and
    `logprobs`, the prompt sent as token ids, vllm/entrypoints/openai/completion/protocol.py
    echo_without_generation), or an error."""
    body = {
        "model": model,
        "prompt": list(ids),
        "max_tokens": 0,
        "echo": True,
        "logprobs": 1,
        "temperature": 0.0,
        "return_tokens_as_token_ids": True,
        "stream": False,
    }
    status, doc = _post(url, "/v1/completions", body, timeout_s)
    error = _error(status, doc)
    if error is not None:
        return None, error
    try:
        lp = doc["choices"][0]["logprobs"]
        tokens = [_token_id(t) for t in lp["tokens"]]
        values = lp["token_logprobs"]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        return None, f"no prompt log-probs in the answer ({type(exc).__name__}: {exc})"
    if tokens[: len(ids)] != list(ids) or len(values) < len(ids):
        return None, "prompt log-probs: the echoed tokens are not the prompt's"
    return [float(x) for x in values[1 : len(ids)]], None


def prefill_requester(
    ep: Endpoint, timeout_s: float
) -> Callable[[list[int]], tuple[list[float] | None, str | None]] | None:
    """A function ids -> the engine's prefill log-probs of ids[1:], for the endpoints that return
    them (OpenAI completions: vLLM); None for the others (Triton's ensemble returns only the
    generated tokens' log-probs)."""
    if ep.protocol != "openai" or ep.endpoint_type != "completions":
        return None
    return lambda ids: openai_prompt_logprobs(ep.url, ep.model, ids, timeout_s)


def _token_id(token: str) -> int:
    if not token.startswith(TOKEN_ID_PREFIX):
        raise ValueError(f"token {token[:40]!r} is not {TOKEN_ID_PREFIX}<id>")
    return int(token[len(TOKEN_ID_PREFIX) :])


def triton_http_url(ep: Endpoint, recipe: Recipe) -> str:
    """The HTTP host:port of the Triton server behind `ep` (its gRPC port cannot carry HTTP
    generate)."""
    if ep.protocol is Protocol.HTTP:
        return ep.url
    from trtkv.contracts.artifacts import ServerRecord
    from trtkv.recipe.layout import serve_dir

    info = ServerRecord.load(serve_dir(recipe))
    if info is not None:
        return f"{info.client_host}:{info.http_port}"
    host = ep.url.rpartition(":")[0] or recipe.triton.host
    return f"{host}:{recipe.triton.http_port}"


def requester(
    ep: Endpoint, recipe: Recipe, tokenizer: Any, tokens: int, timeout_s: float
) -> Callable[[str, list[int]], Served]:
    """A function (prompt text, its ids) -> Served for the endpoint's protocol."""
    if ep.protocol is Protocol.OPENAI:
        if ep.endpoint_type != "completions":
            raise TrtkvError(
                "fidelity: the OpenAI chat endpoint re-templates the prompt; the task needs "
                "--endpoint-type completions."
            )
        return lambda prompt, ids: openai_request(ep.url, ep.model, ids, tokens, timeout_s)
    if not ep.interface.per_token_log_probs:
        raise TrtkvError(
            f"fidelity: the {ep.interface.layout} layout's model {ep.model!r} returns a cumulative "
            "log-prob only, not one per token. Next: bench the ensemble layout or an OpenAI "
            "server (trtllm-serve, vLLM)."
        )
    url = triton_http_url(ep, recipe)
    return lambda prompt, ids: triton_request(url, ep.model, tokenizer, prompt, tokens, timeout_s)
