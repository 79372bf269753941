"""The metrics of the probe's passes against the reference: the LM head's per-position KL, NLL and
top-1 agreement (one reference head shared by every pending format), the rows where a windowed
model's head runs, the probe.json record of a format at each context length, and the scale-reuse
summary (amax and clipping along the text)."""

from __future__ import annotations

import math
from typing import Any

import torch

from trtkv.kvcache.formats import KVFormat, kv_bytes_per_token
from trtkv.kvcache.names import KIVI_RESIDUAL, FormatChoice
from trtkv.kvcache.scales import KVScales
from trtkv.probe.placement import LOGIT_CHUNK
from trtkv.probe.setup import Loaded, semantics


def logprobs(model, hidden: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    logits = model.lm_head(hidden).float()
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:  # as the model's own forward does (Gemma 2; None on Gemma 3)
        logits = torch.tanh(logits / cap) * cap
    return torch.log_softmax(logits, dim=-1)


def head_positions(loaded: Loaded, count: int) -> torch.Tensor | None:
    """Positions (of `count` predictions) where the LM head runs: every position for a
    full-attention model (as before), a uniform stride for a windowed one (its 262K-wide head would
    cost more than the model)."""
    samples = loaded.info.get("head_positions")
    if not samples or count <= samples:
        return None
    stride = -(-count // samples)
    return torch.arange(0, count, stride)


def position_metrics(
    model,
    ref_hidden: torch.Tensor,
    hidden: torch.Tensor,
    targets: torch.Tensor,  # noqa: ANN001
    positions: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Per position t (predicting token t+1): KL(ref || q), NLL under q and ref, top-1 agreement; at
    `positions` only when given (their indices are kept as "pos")."""
    if positions is not None:
        same = hidden is ref_hidden
        idx = positions.to(ref_hidden.device)
        ref_hidden, targets = ref_hidden[idx], targets.to(ref_hidden.device)[idx]
        hidden = ref_hidden if same else hidden[idx]
        return {**position_metrics(model, ref_hidden, hidden, targets), "pos": positions.cpu()}
    return head_metrics(model, ref_hidden, {"q": hidden}, targets)["q"]


def head_metrics(
    model,
    ref_hidden: torch.Tensor,
    hiddens: dict[str, torch.Tensor],  # noqa: ANN001
    targets: torch.Tensor,
) -> dict[str, dict[str, torch.Tensor]]:
    """position_metrics for several formats over the same rows: the reference's LM head and
    log-softmax run once per chunk of rows, shared by every format (a 262K-wide head costs as much
    as the rest of a pass)."""
    parts: dict[str, dict[str, list[torch.Tensor]]] = {
        k: {"kl": [], "nll_q": [], "nll_ref": [], "agree": []} for k in hiddens
    }
    with torch.inference_mode():
        for s in range(0, targets.shape[0], LOGIT_CHUNK):
            e = min(s + LOGIT_CHUNK, targets.shape[0])
            lr = logprobs(model, ref_hidden[s:e])
            t = targets[s:e].to(lr.device).unsqueeze(-1)
            nll_ref = -lr.gather(-1, t).squeeze(-1)
            top_ref = lr.argmax(-1)
            p_ref = lr.exp()  # shared too
            for name, hidden in hiddens.items():
                lq = lr if hidden is ref_hidden else logprobs(model, hidden[s:e])
                acc = parts[name]
                acc["kl"].append((p_ref * (lr - lq)).sum(-1).clamp(min=0.0))
                acc["nll_q"].append(-lq.gather(-1, t).squeeze(-1))
                acc["nll_ref"].append(nll_ref)
                acc["agree"].append((top_ref == lq.argmax(-1)).float())
                del lq
            del lr, p_ref
    return {name: {k: torch.cat(v).cpu() for k, v in acc.items()} for name, acc in parts.items()}


def finish_runs(loaded: Loaded, runs: dict[str, dict], ref_hidden: torch.Tensor, n: int) -> None:
    """Fill in "metrics" of the runs run_format(defer_head=True) left pending (their "hidden" at the
    metric rows): the reference's LM head runs once for all of them (head_metrics)."""
    pending = {k: r for k, r in runs.items() if "hidden" in r}
    if not pending:
        return
    targets = torch.tensor(loaded.text_ids[1:n], device=ref_hidden.device)
    positions = next(iter(pending.values()))["positions"]
    sampled = positions is not None and ref_hidden.shape[0] == positions.numel()
    ref = ref_hidden if sampled else ref_hidden[: n - 1]
    if positions is not None:
        idx = positions.to(ref.device)
        targets = targets[idx]
        if not sampled:  # dense hidden states, metrics at the sampled rows
            ref = ref[idx]
            for r in pending.values():
                r["hidden"] = None if r["hidden"] is None else r["hidden"][idx]
    hiddens = {k: ref if r["hidden"] is None else r["hidden"] for k, r in pending.items()}
    metrics = head_metrics(loaded.model, ref, hiddens, targets)
    for k, r in pending.items():
        r["metrics"] = metrics[k] if positions is None else {**metrics[k], "pos": positions.cpu()}
        del r["hidden"], r["positions"]


def length_record(loaded: Loaded, choice: FormatChoice, run: dict, n: int, ref_bytes: dict) -> dict:
    """The probe.json record of one format at context length n (from a pass over >= n tokens)."""
    q0 = (3 * n) // 4
    pos = run["metrics"].get("pos")
    if pos is None:
        m = {k: v[: n - 1].double() for k, v in run["metrics"].items()}
        last = m["kl"][q0:] if q0 < n - 1 else m["kl"]
    else:  # sampled positions (a windowed model's pass): those before n - 1
        keep = pos < n - 1
        m = {k: v[keep].double() for k, v in run["metrics"].items() if k != "pos"}
        late = pos[keep] >= q0
        last = m["kl"][late] if bool(late.any()) else m["kl"]
    ppl = math.exp(float(m["nll_q"].mean()))
    ppl_ref = math.exp(float(m["nll_ref"].mean()))
    info = loaded.info
    per_token_elems = 2 * info["num_layers"] * info["num_kv_heads"] * info["head_dim"]
    formula = kv_bytes_per_token(
        info["num_layers"], info["num_kv_heads"], info["head_dim"], choice.base
    )
    # the reference's
    measured = run["bytes_per_token"] if "bytes_per_token" in run else ref_bytes["bytes_per_token"]
    rec = {
        "format": choice.name,
        "context_len": n,
        "kl_mean": float(m["kl"].mean()),
        "kl_last_quarter": float(last.mean()),
        "ppl": ppl,
        "ppl_ref": ppl_ref,
        "ppl_delta": ppl - ppl_ref,
        "top1_agreement": float(m["agree"].mean()),
        "needle_accuracy": None,
        "clip_rate": None,
        "k_clip_rate": None,
        "v_clip_rate": None,
        "kv_bytes_per_token": measured,
        "kv_bytes_per_token_formula": formula,
        "bytes_vs_formula": measured / formula if formula else None,
        "kv_semantics": semantics(choice),
        "positions": int(m["kl"].numel()),
    }
    if run.get("clip_positions") is not None:
        clipped = float(run["clip_positions"][:n].sum())
        rec["clip_rate"] = clipped / (n * per_token_elems)
    if run.get("clip"):
        layers = run["clip"]["layers"]
        elems = sum(x["elements"] for x in layers) / 2
        rec["k_clip_rate"] = sum(x["k_clip"] for x in layers) / elems if elems else 0.0
        rec["v_clip_rate"] = sum(x["v_clip"] for x in layers) / elems if elems else 0.0
        rec["k_clip_rate_note"] = (
            f"K/V clip rates over all {run['quantized_tokens']} tokens of the pass"
        )
    if choice.base in (KVFormat.KIVI4, KVFormat.KIVI2):
        rec["fp16_window_tokens"] = KIVI_RESIDUAL
        rec["fp16_window_bytes_max"] = KIVI_RESIDUAL * per_token_elems * 2
    return rec


def scale_reuse_summary(scales: KVScales, runs: dict[str, dict], lengths: list[int]) -> dict:
    """Calibrated amax (short prompts) vs amax observed over the long text, and clipping by
    position."""
    out: dict[str, Any] = {"scales_source": scales.source, "formats": {}}
    for name, run in runs.items():
        clip = run.get("clip")
        if not clip:
            continue
        layers = clip["layers"]
        k_ratio = [x["k_observed_amax"] / x["k_limit"] for x in layers if x["k_limit"] > 0]
        v_ratio = [x["v_observed_amax"] / x["v_limit"] for x in layers if x["v_limit"] > 0]
        per_pos = run.get("clip_positions")
        buckets = []
        if per_pos is not None:
            edges = [0] + [n for n in lengths if n <= per_pos.shape[0]]
            for a, b in zip(edges, edges[1:], strict=False):
                kl = kl_between(run["metrics"], a, b - 1)
                buckets.append(
                    {
                        "from": a,
                        "to": b,
                        "clipped_elements": int(per_pos[a:b].sum()),
                        "kl_mean": float(kl.mean()) if kl.numel() else 0.0,
                    }
                )
        out["formats"][name] = {
            "layers_exceeding_range_k": sum(1 for r in k_ratio if r > 1),
            "layers_exceeding_range_v": sum(1 for r in v_ratio if r > 1),
            "max_observed_over_range_k": max(k_ratio, default=0.0),
            "max_observed_over_range_v": max(v_ratio, default=0.0),
            "by_position": buckets,
        }
    return out


def kl_between(metrics: dict, a: int, b: int) -> torch.Tensor:
    """The KL values of positions a <= t < b (all positions, or the sampled ones in
    metrics["pos"])."""
    pos = metrics.get("pos")
    if pos is None:
        return metrics["kl"][a:b]
    return metrics["kl"][(pos >= a) & (pos < b)]
