"""Run NVIDIA aiconfigurator's estimates for trtkv, in aiconfigurator's own venv (.venv-aic), and print JSON.

This script imports no trtkv: aiconfigurator needs numpy >= 2.1, which trtkv's venv cannot hold. trtkv's adapter
(trtkv/plan/aic.py) writes one request as JSON on stdin and reads one JSON document from stdout; everything
aiconfigurator prints while it works goes to stderr.

Request: {"model_path", "system", "backend", "backend_version" (null: the newest data), "tp", "pp", "isl", "osl",
          "gemm_quant_mode" (null: aiconfigurator's inference), "moe_quant_mode" (absent: its inference), "max_seq_len",
          "cases": [{"kv": "bfloat16" | "fp8", "concurrency": N}, ...],
          a MoE model also "attention_dp", "moe_tp", "moe_ep" (tp x attention_dp = moe_tp x moe_ep: trtkv/plan/aic.py
          moe_parallelism); concurrency counts every attention-DP rank's requests (aiconfigurator's batch_size is per
          rank: concurrency / attention_dp, rounded up)}
Answer:  {"aiconfigurator": version, "aiconfigurator_core": version,
          "rows": [{"kv", "concurrency", "ttft_ms", "itl_ms", "tokens_per_s_per_gpu", "tokens_per_s_per_user",
                    "backend", "backend_version", "system", "memory_gib", "gemm", "fmha"}, ...],
          "errors": [{"kv", "concurrency", "error"}, ...]}
A request {"requests": [request, ...]} answers {"aiconfigurator", "aiconfigurator_core", "answers": [answer, ...]}
(one process, aiconfigurator's data loaded once: scripts/record_aiconfigurator.py uses it).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import logging
import os
import sys

MAX_REQUEST_BYTES = 1 << 20


def _estimate(req: dict, case: dict) -> dict:
    from aiconfigurator.cli import api

    dp = int(req.get("attention_dp") or 1)
    kwargs = {"backend_name": req["backend"], "isl": int(req["isl"]), "osl": int(req["osl"]),
              "batch_size": -(-int(case["concurrency"]) // dp), "tp_size": int(req.get("tp", 1)),
              "pp_size": int(req.get("pp", 1)), "kvcache_quant_mode": case["kv"]}
    for key, name in (("attention_dp", "attention_dp_size"), ("moe_tp", "moe_tp_size"), ("moe_ep", "moe_ep_size")):
        if req.get(key):
            kwargs[name] = int(req[key])
    if req.get("backend_version"):
        kwargs["backend_version"] = req["backend_version"]
    if req.get("gemm_quant_mode"):
        kwargs["gemm_quant_mode"] = req["gemm_quant_mode"]
    if req.get("moe_quant_mode"):
        kwargs["moe_quant_mode"] = req["moe_quant_mode"]
    if req.get("max_seq_len"):
        kwargs["max_seq_len"] = int(req["max_seq_len"])
    r = api.cli_estimate(req["model_path"], req["system"], **kwargs).raw
    return {"kv": case["kv"], "concurrency": int(case["concurrency"]), "ttft_ms": float(r["ttft"]),
            "itl_ms": float(r["tpot"]), "tokens_per_s_per_gpu": float(r["tokens/s/gpu"]),
            "tokens_per_s_per_user": float(r["tokens/s/user"]), "backend": str(r["backend"]),
            "backend_version": str(r["version"]), "system": str(r["system"]), "memory_gib": float(r["memory"]),
            "gemm": str(r["gemm"]), "fmha": str(r["fmha"])}


def main() -> int:
    raw = sys.stdin.read(MAX_REQUEST_BYTES + 1)
    if len(raw) > MAX_REQUEST_BYTES:
        print(json.dumps({"error": "request larger than 1 MiB"}))
        return 2
    doc = json.loads(raw)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.disable(logging.WARNING)
    real_stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        answers = [_answer(req) for req in doc.get("requests", [doc])]
    versions = {"aiconfigurator": importlib.metadata.version("aiconfigurator"),
                "aiconfigurator_core": importlib.metadata.version("aiconfigurator-core")}
    out = {**versions, "answers": [{**versions, **a} for a in answers]} if "requests" in doc else {**versions, **answers[0]}
    real_stdout.write(json.dumps(out) + "\n")
    return 0


def _answer(req: dict) -> dict:
    rows, errors = [], []
    for case in req["cases"]:
        try:
            rows.append(_estimate(req, case))
        except Exception as exc:  # noqa: BLE001 - any failure of one case is reported, the others still run
            errors.append({"kv": case.get("kv"), "concurrency": case.get("concurrency"),
                           "error": f"{type(exc).__name__}: {exc}"[:500]})
    return {"rows": rows, "errors": errors}


if __name__ == "__main__":
    sys.exit(main())
