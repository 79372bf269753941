"""The probe's attention modes: which engine attention a recipe's deployment computes
(`probe.attention: auto`), which probed formats a mode runs with, a pass under a mode, and the
prefill-vs-decode drift experiment.

Every format is measured cache-only (the stored cache dequantized into full-precision attention); a
format an engine mode applies to (FP8 storage for the FP8 kernels; INT8 for TensorRT-LLM's INT8
path) is measured again under that mode, in the decode view (every scored position computed by the
mode's decode kernel: the probe's worst case, as before). The drift experiment prefills a prompt
with the prefill kernel and then teacher-forces the next tokens through the decode kernel, against
the same text prefilled at once: a causal pass whose rows from the prompt's end on use the decode
kernel computes exactly what token-by-token decoding computes (each row sees the rows before it), so
one pass per side measures it; with identical kernels (cache-only) both sides run the same code on
the same inputs and the drift is exactly 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import torch

from trtkv.core.errors import TrtkvError
from trtkv.kvcache.attention_modes import (
    AUTO,
    CACHE_ONLY,
    AttentionMode,
    load_attention,
)
from trtkv.kvcache.names import FormatChoice
from trtkv.recipe.engine_attention import recipe_mode

if TYPE_CHECKING:
    from trtkv.recipe import Recipe


def resolve_modes(recipe: Recipe, requested: str | None = None) -> tuple[list[str], dict[str, str]]:
    """The modes a probe run measures, cache_only first, and why each is there. `requested`: `auto`
    (the recipe's deployment), `cache_only`, or mode names separated by commas; None: the recipe's
    probe.attention."""
    text = (requested or recipe.probe.attention).strip()
    table = load_attention()
    if text == AUTO:
        mode, why = recipe_mode(recipe)
        reasons = {CACHE_ONLY: "the stored cache alone (dequantize-on-read)"}
        if mode != CACHE_ONLY:
            reasons[mode] = f"auto: {why}"
        else:
            reasons[CACHE_ONLY] += f"; auto: {why}"
        return list(reasons), reasons
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        table.mode(n)  # a TrtkvError naming the allowed modes
    reasons = {CACHE_ONLY: "the stored cache alone (dequantize-on-read)"}
    reasons.update({n: "requested" for n in names if n != CACHE_ONLY})
    return list(reasons), reasons


def applies(mode: AttentionMode, choice: FormatChoice) -> bool:
    """Whether `mode`'s kernels read a cache stored as `choice` the way its engine stores it (its
    probe_formats; cache_only applies to every format)."""
    return "*" in mode.probe_formats or choice.name in mode.probe_formats


@contextmanager
def attending(
    loaded: Any, mode_name: str, cache: Any, decode_from: int | None = 0
) -> Iterator[Any]:
    """Run the model under `mode_name` over `cache` inside the block (cache_only: the model's own
    attention)."""
    if mode_name == CACHE_ONLY:
        with nullcontext():
            yield None
        return
    from trtkv.kvcache.attention_hook import EngineRun, engine_attention, q_scales_for

    mode = load_attention().mode(mode_name)
    run = EngineRun(
        mode, cache, decode_from, q_scales_for(cache, mode), loaded.info.get("head_dim") or 0
    )
    with engine_attention(loaded.model, run):
        yield run


def record_fields(mode_name: str) -> dict[str, Any]:
    """What a probe.json record says about its attention."""
    if mode_name == CACHE_ONLY:
        return {"attention": CACHE_ONLY}
    mode = load_attention().mode(mode_name)
    k = mode.decode
    return {
        "attention": mode_name,
        "attention_engine": mode.engine,
        "attention_numerics": f"decode view ({k.kernel}): Q {k.q} ({k.q_scale}), K/V {k.kv}, P "
        f"{k.p}" + (f" x{k.p_scale:g}" if k.p != "none" else ""),
    }


# ----------------------------------------------------------------------------- prefill vs decode


def _logprobs(model: Any, hidden: torch.Tensor) -> torch.Tensor:
    logits = model.lm_head(hidden)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return torch.log_softmax(logits, dim=-1)


def drift_pass(
    loaded: Any,
    make_cache: Any,
    mode_name: str,
    ids: torch.Tensor,
    decode_from: int | None,
    chunk: int | None,
) -> torch.Tensor:
    """Log-probabilities [rows, vocab] at rows decode_from.. of `ids` [1, T]: the prompt (rows
    before decode_from) through the prefill kernel, the rest through the decode kernel (decode_from
    None: every row prefilled)."""
    from trtkv.probe.passes import feed

    start = decode_from if decode_from is not None else 0
    cache = make_cache()
    with attending(loaded, mode_name, cache, decode_from), torch.inference_mode():
        hidden = feed(loaded.model, ids, cache, chunk)
        return _logprobs(loaded.model, hidden[0, start:])


def drift(
    loaded: Any, make_cache: Any, mode_name: str, prompt: int, steps: int, chunk: int | None = None
) -> dict[str, Any]:
    """The prefill-vs-decode drift of `mode_name`: `prompt` tokens of the text prefilled, the next
    `steps` fed one by one through the decode kernel (teacher-forced); their log-probabilities of
    the text's next tokens against the same rows of one prefill pass over the whole text."""
    if prompt < 1 or steps < 1 or prompt + steps + 1 > len(loaded.text_ids):
        raise TrtkvError(
            f"drift: prompt {prompt} + steps {steps} + 1 must fit the {len(loaded.text_ids)}-token "
            "text."
        )
    text = loaded.text_ids
    ids = torch.tensor([text[: prompt + steps]], device=loaded.device)
    prefilled = drift_pass(loaded, make_cache, mode_name, ids, None, chunk)[prompt : prompt + steps]
    decoded = drift_pass(loaded, make_cache, mode_name, ids, prompt, chunk)
    targets = torch.tensor(text[prompt + 1 : prompt + steps + 1], device=decoded.device).unsqueeze(
        -1
    )
    dlp = (decoded.gather(-1, targets) - prefilled.gather(-1, targets)).squeeze(-1).double().cpu()
    kl = (prefilled.exp() * (prefilled - decoded)).sum(-1).clamp(min=0).double().cpu()
    agree = (prefilled.argmax(-1) == decoded.argmax(-1)).double().cpu()
    return {
        "attention": mode_name,
        "prompt_tokens": prompt,
        "decode_steps": steps,
        "mean_abs_dlogp": float(dlp.abs().mean()),
        "max_abs_dlogp": float(dlp.abs().max()),
        "kl_mean": float(kl.mean()),
        "top1_agreement": float(agree.mean()),
        "exact_zero": bool(torch.equal(decoded, prefilled)),
    }
