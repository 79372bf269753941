"""Derive the kernel efficiencies of trtkv's own speed model from aiconfigurator's measured kernel tables; print JSON.

Runs in aiconfigurator's venv (.venv-aic) and imports no trtkv (`make speed-efficiencies` writes its output to
trtkv/data/speed_efficiencies.json). Each efficiency is (ideal time at the GPU's datasheet figure, as the system's
YAML in aiconfigurator-core gives it) / (the latency aiconfigurator measured on that GPU), read at ONE fixed shape per
kernel, named below and in the output, so a reader can check every figure against the parquet row it came from.

Reference shapes (per GPU, after tensor parallelism); chosen as a 70B-class layer at TP4, so the end-to-end cases
trtkv's tests compare against (8B-class models at TP1) are not the shapes the efficiencies come from:
  gemm_memory   m=8, 16, 32 tokens, n=k=8192          weight bytes / HBM bandwidth     (decode GEMMs: weight-bound)
  gemm_compute  m=2048, 4096, 8192, 16384, n=k=8192   2mnk / tensor-core peak         (prefill GEMMs: compute-bound)
                (GEMMs: the median over those m; one m alone is noisy, e.g. H200 SGLang 0.51 at 8192, 0.80 at 2048)
  attn_decode   batch 16, 16 query heads, 2 KV heads, head_dim 128, context 16383: KV bytes / HBM bandwidth;
                and the same at context 1 (the kernel's fixed cost per call)
  attn_prefill  batch 1, 8192 tokens, 16 query heads, 2 KV heads, head_dim 128, causal: 2 x 2 x heads x head_dim x
                tokens^2 / 2 / BF16 tensor-core peak
  elementwise   the system YAML's own memory-op model (mem_bw_empirical_scaling_factor, mem_empirical_constant_latency)
  allreduce     NCCL all_reduce over 4 GPUs: the floor at 4,096 half elements; bus bandwidth at 16,777,216 elements
                against the YAML's intra-node bandwidth
"""

from __future__ import annotations

import glob
import importlib.metadata
import json
import os
import sys

SYSTEMS = ("a100_sxm", "h100_sxm", "h200_sxm", "b200_sxm", "b300_sxm", "gb200", "l40s", "rtx_pro_6000_server")
BACKENDS = ("trtllm", "vllm", "sglang")
GEMM_M_DECODE, GEMM_M_PREFILL, GEMM_NK = (8, 16, 32), (2048, 4096, 8192, 16384), 8192
HEADS, KV_HEADS, HEAD_DIM, DEC_BATCH, DEC_CTX, PREFILL_LEN = 16, 2, 128, 16, 16383, 8192
KV_BYTES = {"bfloat16": 2.0, "fp8": 1.0, "int8": 1.0}
AR_GPUS, AR_SMALL, AR_LARGE = 4, 4096, 16777216


def _version_key(v: str) -> tuple:
    parts = []
    for p in v.replace("rc", ".").split("."):
        parts.append(int(p) if p.isdigit() else -1)
    return tuple(parts)


def _newest(folder: str, table: str) -> str | None:
    """The newest version folder under `folder` that holds `table`."""
    versions = [os.path.basename(os.path.dirname(p)) for p in glob.glob(os.path.join(folder, "*", table))]
    return max(versions, key=_version_key) if versions else None


def _best(df, **where) -> tuple[float, str] | None:
    for k, v in where.items():
        df = df[df[k] == v]
    if df.empty:
        return None
    row = df.loc[df["latency"].idxmin()]
    return float(row["latency"]), str(row["kernel_source"])


def _gemm(pd, path: str, gpu: dict) -> dict:
    df = pd.read_parquet(path)
    out: dict = {}
    for dtype, wbytes, peak in (("bfloat16", 2, gpu["bfloat16_tc_flops"]), ("fp8", 1, gpu.get("fp8_tc_flops"))):
        mem = [(m, _best(df, gemm_dtype=dtype, m=m, n=GEMM_NK, k=GEMM_NK)) for m in GEMM_M_DECODE]
        rows = [(m, got[0], got[1], GEMM_NK * GEMM_NK * wbytes / gpu["mem_bw"] * 1e3 / got[0]) for m, got in mem if got]
        if rows:
            out[f"gemm_memory.{dtype}"] = _median_row(rows)
        cmp = [(m, _best(df, gemm_dtype=dtype, m=m, n=GEMM_NK, k=GEMM_NK)) for m in GEMM_M_PREFILL] if peak else []
        rows = [(m, got[0], got[1], 2 * m * GEMM_NK * GEMM_NK / peak * 1e3 / got[0]) for m, got in cmp if got]
        if rows:
            out[f"gemm_compute.{dtype}"] = _median_row(rows)
    return out


def _median_row(rows: list[tuple[int, float, str, float]]) -> dict:
    """The median efficiency over the reference m values, with every row it came from."""
    effs = sorted(r[3] for r in rows)
    mid = len(effs) // 2
    median = effs[mid] if len(effs) % 2 else (effs[mid - 1] + effs[mid]) / 2
    return {"efficiency": median, "rows": [{"m": m, "latency_ms": lat, "kernel": kern, "efficiency": eff}
                                           for m, lat, kern, eff in rows]}


def _attention(pd, folder: str, gpu: dict) -> dict:
    out: dict = {}
    gen = os.path.join(folder, "generation_attention_perf.parquet")
    ctx = os.path.join(folder, "context_attention_perf.parquet")
    if os.path.exists(gen):
        df = pd.read_parquet(gen)
        if "window_size" in df:
            df = df[df["window_size"] == 0]
        for kv, kv_bytes in KV_BYTES.items():
            shape = {"batch_size": DEC_BATCH, "num_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
                     "kv_cache_dtype": kv}
            big = _best(df, step=DEC_CTX, **shape)
            small = _best(df, step=1, **shape)
            if big and small:
                ideal = DEC_BATCH * (DEC_CTX + 1) * 2 * KV_HEADS * HEAD_DIM * kv_bytes / gpu["mem_bw"] * 1e3
                out[f"attn_decode.{kv}"] = {"efficiency": ideal / (big[0] - small[0]), "latency_ms": big[0],
                                            "floor_ms": small[0], "kernel": big[1]}
    if os.path.exists(ctx):
        df = pd.read_parquet(ctx)
        if "window_size" in df:
            df = df[df["window_size"] == 0]
        for kv in KV_BYTES:
            got = _best(df, batch_size=1, isl=PREFILL_LEN, num_heads=HEADS, num_key_value_heads=KV_HEADS,
                        head_dim=HEAD_DIM, kv_cache_dtype=kv)
            if got:
                ideal = 2 * 2 * HEADS * HEAD_DIM * PREFILL_LEN * PREFILL_LEN / 2 / gpu["bfloat16_tc_flops"] * 1e3
                out[f"attn_prefill.{kv}"] = {"efficiency": ideal / got[0], "latency_ms": got[0], "kernel": got[1]}
    return out


def _allreduce(pd, root: str, gpu: dict, intra_bw: float) -> dict:
    version = _newest(os.path.join(root, "comm", "nccl"), "nccl_perf.parquet")
    if version is None:
        return {}
    df = pd.read_parquet(os.path.join(root, "comm", "nccl", version, "nccl_perf.parquet"))
    df = df[(df["op_name"] == "all_reduce") & (df["num_gpus"] == AR_GPUS)]
    small = df[df["message_size"] == AR_SMALL]["latency"].min()
    large = df[df["message_size"] == AR_LARGE]["latency"].min()
    if small != small or large != large:  # NaN: no such rows
        return {}
    bus = AR_LARGE * 2 * 2 * (AR_GPUS - 1) / AR_GPUS / (large * 1e-3)
    return {"allreduce": {"nccl": version, "floor_ms": float(small), "bus_efficiency": bus / intra_bw,
                          "latency_ms": float(large)}}


def main() -> int:
    import aiconfigurator_core
    import pandas as pd
    import yaml

    sys_dir = os.path.join(os.path.dirname(aiconfigurator_core.__file__), "systems")
    out: dict = {"aiconfigurator_core": importlib.metadata.version("aiconfigurator-core"), "shapes": __doc__.split(
        "Reference shapes")[1].strip(), "systems": {}}
    for name in SYSTEMS:
        spec = yaml.safe_load(open(os.path.join(sys_dir, f"{name}.yaml")))
        gpu, node = spec["gpu"], spec["node"]
        root = os.path.join(sys_dir, spec["data_dir"])
        keys = ("mem_bw", "bfloat16_tc_flops", "fp8_tc_flops", "sm_version", "mem_bw_empirical_scaling_factor",
                "mem_empirical_constant_latency")
        entry: dict = {"gpu": {k: gpu.get(k) for k in keys},
                       "intra_node_bw": node["intra_node_bw"], "backends": {}}
        entry.update(_allreduce(pd, root, gpu, node["intra_node_bw"]))
        for backend in BACKENDS:
            gv = _newest(os.path.join(root, "gemm", backend), "gemm_perf.parquet")
            av = _newest(os.path.join(root, "attention", backend), "generation_attention_perf.parquet")
            if gv is None or av is None:
                continue
            figures = _gemm(pd, os.path.join(root, "gemm", backend, gv, "gemm_perf.parquet"), gpu)
            figures.update(_attention(pd, os.path.join(root, "attention", backend, av), gpu))
            entry["backends"][backend] = {"gemm_version": gv, "attention_version": av, **figures}
        out["systems"][name] = entry
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
