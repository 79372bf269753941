"""probe.json records and documents for tests that need a probe result without running the probe: every key the
probe writes for a cache-only record (trtkv.probe.metrics.length_record), through the model the readers use
(trtkv.contracts.probe_doc)."""

from __future__ import annotations

from typing import Any

from trtkv.contracts.probe_doc import ProbeDoc, ProbeRecord


def record_dict(fmt: str, n: int, kl: float, clip: float | None = None, bpt: float = 100.0, **more: Any) -> dict:
    """One record as probe.json holds it: KL `kl`, top-1 agreement 1 - kl, ppl 9 (+kl), `bpt` bytes per token."""
    return {"format": fmt, "context_len": n, "kl_mean": kl, "kl_last_quarter": kl, "ppl": 9.0 + kl, "ppl_ref": 9.0,
            "ppl_delta": kl, "top1_agreement": 1.0 - kl, "needle_accuracy": None, "clip_rate": clip,
            "k_clip_rate": None, "v_clip_rate": None, "kv_bytes_per_token": bpt, "kv_bytes_per_token_formula": bpt,
            "bytes_vs_formula": 1.0, "kv_semantics": "test", "positions": n - 1, "attention": "cache_only", **more}


def record(fmt: str, n: int, kl: float, clip: float | None = None, bpt: float = 100.0, **more: Any) -> ProbeRecord:
    return ProbeRecord.model_validate(record_dict(fmt, n, kl, clip, bpt, **more))


def probe_doc(records: list[ProbeRecord], recipe: str = "r", **written: Any) -> ProbeDoc:
    """A probe.json document of `records`; `written`: its untyped parts (settings, needles, reference, ...)."""
    return ProbeDoc.model_validate({"recipe": recipe, "records": [r.model_dump(exclude_unset=True) for r in records],
                                    **written})
