"""Derive the kernel efficiencies of trtkv's own speed model from aiconfigurator's measured kernel tables; print JSON.

Runs in aiconfigurator's venv (.venv-aic) and imports no trtkv (`make speed-efficiencies` writes its output to
trtkv/data/speed_efficiencies.json). Each efficiency is (ideal time at the GPU's datasheet figure, as the system's
YAML in aiconfigurator-core gives it) / (the latency aiconfigurator measured on that GPU), read at ONE fixed shape per
kernel, named below and in the output, so a reader can check every figure against the parquet row it came from.

Reference shapes (per GPU, after tensor parallelism): kernel rows only; no end-to-end estimate and no measurement is
used. Attention is read at a 70B-class layer at TP4, which no end-to-end case trtkv's tests compare against has:
  gemm_memory   m=1, 8, 16, 32 tokens x n=k=4096, 8192, 16384 (decode GEMMs: weight-bound; work = weight bytes; m=1
                the GEMM a concurrency-1 decode runs, whose kernel can differ: vLLM's FP8 on B200 1.8x its m=8 time)
  gemm_compute  m=2048..16384 tokens x n=k=4096, 8192, 16384   (prefill GEMMs: compute-bound; work = 2mnk)
                (weight-bound: latency = fixed + bytes / (bandwidth x efficiency), least squares over those rows: one
                size alone mixes the fixed cost into the efficiency, e.g. TensorRT-LLM's FP8 GEMM on B200 reads 0.13
                of the bandwidth at 4096 x 4096 and 0.60 at 16384 x 16384; compute-bound: the median efficiency)
  attn_decode   batch 16, 16 query heads, 2 KV heads, head_dim 128, context 16383: KV bytes / HBM bandwidth;
                and the same at context 1 (the kernel's fixed cost per call)
  attn_prefill  batch 1, 8192 tokens, 16 query heads, 2 KV heads, head_dim 128, causal: 2 x 2 x heads x head_dim x
                tokens^2 / 2 / BF16 tensor-core peak
  elementwise   the system YAML's own memory-op model (mem_bw_empirical_scaling_factor, mem_empirical_constant_latency)
  allreduce     NCCL all_reduce over 4 GPUs: the floor at 4,096 half elements; bus bandwidth at 16,777,216 elements
                against the YAML's intra-node bandwidth (the fallback where an engine has no table below)
  custom_allreduce  the engine's own all-reduce (comm/<engine>/<version>/custom_allreduce_perf.parquet, the GEMM
                tables' version or the newest; its CUDA-graph rows where it has eager ones too, as aiconfigurator
                prices a TP MoE layer's dispatch and combine), per GPU count, every message size the table holds:
                t = floor + 2 (n - 1) / n x bytes / (intra-node bandwidth x bus efficiency), by relative least
                squares (non-negative)
  moe           the fused MoE op (moe/<engine>/<version>/moe_perf.parquet, the GEMM tables' version), per expert
                dtype, every shape the table holds at moe_tp 1, EP 1, "balanced" routing (a step of N tokens then
                reads exactly min(E, N k) experts): t = fixed + max(their bytes / (bandwidth x mem efficiency) +
                experts x per-expert cost, 2 N k expert params / (tensor-core peak x compute efficiency)); fixed,
                per-expert cost and mem efficiency (at most 1) by relative least squares (non-negative) over rows of
                N <= 64 and N k <= E; the compute efficiency the
                median over rows of N >= 2048 of what the fixed cost leaves, at aiconfigurator's default skewed
                routing ("power_law_1.01" rows: a prefill's busiest expert sets its time, which balanced rows miss)
  moe rows      (`--moe-rows PATH`, trtkv/data/moe_prefill_rows.json) the same table's own rows, per expert dtype, shape
                (hidden/inter/topk/experts) and moe_tp/EP with moe_tp x EP <= 8 (one node), at N = 1,024 .. 16,384
                tokens, "power_law_1.01": the latency aiconfigurator reads for that shape's prefill, which one median
                compute efficiency per dtype misses by up to 2x (gpt-oss-120b's MXFP4 experts on SGLang, H200: 3.0 ms
                a layer at 2,048 tokens, the median 1.8 ms)
  moe decode rows  (`--moe-decode-rows PATH`, trtkv/data/moe_decode_rows.json) the same table's own "balanced" rows,
                per expert dtype, shape and moe_tp/EP (moe_tp x EP <= 8), at its N = 1, 2, 4, ... up to the first N with
                N k >= E: a decode step's time by the experts it reads (min(E, N k) / EP a rank: aiconfigurator's
                collector/helper.py balanced_logits gives token i experts i + j ceil(E / k), alike on every EP rank),
                which the per-dtype fit over every shape misses by up to 2x (gpt-oss-20b's 32 MXFP4 experts on SGLang,
                H100: 0.577 ms a layer at 8 tokens, the fit 0.29 ms)
"""

from __future__ import annotations

import glob
import importlib.metadata
import json
import os
import sys

SYSTEMS = ("a100_sxm", "h100_sxm", "h200_sxm", "b200_sxm", "b300_sxm", "gb200", "l40s", "rtx_pro_6000_server")
# Systems aiconfigurator-core ships a YAML for but no kernel tables ("Estimate-only system spec ... No built-in silicon
# performance database"): their datasheet figures only, under "datasheets" (a100_pcie, a30: no GPU of their own in trtkv)
DATASHEET_ONLY = ("h100_pcie", "l4")
GPU_KEYS = ("mem_bw", "bfloat16_tc_flops", "fp8_tc_flops", "sm_version", "mem_bw_empirical_scaling_factor",
            "mem_empirical_constant_latency")
BACKENDS = ("trtllm", "vllm", "sglang")
GEMM_M_DECODE, GEMM_M_PREFILL, GEMM_NK = (1, 8, 16, 32), (2048, 4096, 8192, 16384), (4096, 8192, 16384)
HEADS, KV_HEADS, HEAD_DIM, DEC_BATCH, DEC_CTX, PREFILL_LEN = 16, 2, 128, 16, 16383, 8192
KV_BYTES = {"bfloat16": 2.0, "fp8": 1.0, "int8": 1.0}
AR_GPUS, AR_SMALL, AR_LARGE = 4, 4096, 16777216
# bytes per expert weight as each moe_perf dtype stores it, scales included (fp8_block: one float32 per 128 x 128;
# MXFP4: E2M1 + one E8M0 per 32; NVFP4: E2M1 + one FP8 per 16; int4_wo: AWQ group 128, fp16 scale + zero)
MOE_BYTES = {"bfloat16": 2.0, "fp8": 1.0, "fp8_block": 1 + 4 / 128 / 128, "w4a16_mxfp4": 0.5 + 1 / 32,
             "nvfp4": 0.5 + 1 / 16, "int4_wo": 0.5 + 4 / 128, "w4a8_mxfp4_mxfp8": 0.5 + 1 / 32}
# the tensor-core peak each dtype's GEMMs run at (NVFP4: FP4's where the YAML has one; weight-only: BF16's)
# the routing a prefill's many tokens see: aiconfigurator's default expert-load distribution (a power law, its
# moe_perf rows "power_law_1.01"); its busiest expert sets a compute-bound step's time, which balanced rows miss
MOE_PREFILL_ROUTING = "power_law_1.01"
# the prefill chunks whose rows the rows file keeps (every table holds them), and the largest moe_tp x EP (one node of 8)
MOE_ROW_TOKENS, MOE_ROW_GPUS = (1024, 2048, 4096, 8192, 16384), 8
# a decode step's rows: "balanced" (N tokens read exactly min(E, N k) experts), at the token counts the tables hold; a
# curve stops at the first N that reads every expert, or before the first count its table lacks
MOE_DECODE_ROUTING = "balanced"
MOE_DECODE_TOKENS = (1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 128)
MOE_PEAK = {"fp8": "fp8_tc_flops", "fp8_block": "fp8_tc_flops", "nvfp4": "fp4_tc_flops",
            "w4a8_mxfp4_mxfp8": "fp8_tc_flops"}


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
    """Per dtype and regime, t = fixed + work / (datasheet rate x efficiency), least squares over the reference rows:
    a GEMM's fixed cost (launch, tail) and its asymptotic efficiency, which one square size alone would mix up."""
    df = pd.read_parquet(path)
    out: dict = {}
    for dtype, wbytes, peak in (("bfloat16", 2, gpu["bfloat16_tc_flops"]), ("fp8", 1, gpu.get("fp8_tc_flops"))):
        for kind, ms, rate in (("gemm_memory", GEMM_M_DECODE, gpu["mem_bw"]), ("gemm_compute", GEMM_M_PREFILL, peak)):
            rows = []
            for m in ms if rate else ():
                for nk in GEMM_NK:
                    got = _best(df, gemm_dtype=dtype, m=m, n=nk, k=nk)
                    if got:
                        work = nk * nk * wbytes if kind == "gemm_memory" else 2 * m * nk * nk
                        rows.append({"m": m, "n": nk, "k": nk, "latency_ms": got[0], "kernel": got[1], "work": work})
            if kind == "gemm_compute" and rows:  # compute-bound: no fixed cost worth the name; the median efficiency
                effs = sorted(r["work"] / rate * 1e3 / r["latency_ms"] for r in rows)
                out[f"{kind}.{dtype}"] = {"efficiency": effs[len(effs) // 2], "rows": rows}
                continue
            fit = _line([r["work"] for r in rows], [r["latency_ms"] for r in rows])
            if fit:
                fixed, per_unit = fit
                out[f"{kind}.{dtype}"] = {"efficiency": 1 / (per_unit * 1e-3 * rate), "fixed_ms": max(0.0, fixed),
                                          "rows": rows}
    return out


def _line(x: list[float], y: list[float]) -> tuple[float, float] | None:
    """Least squares y = a + b x; None without two distinct x or with b <= 0."""
    if len(set(x)) < 2:
        return None
    mx, my = sum(x) / len(x), sum(y) / len(y)
    b = sum((a - mx) * (c - my) for a, c in zip(x, y, strict=True)) / sum((a - mx) ** 2 for a in x)
    return (my - b * mx, b) if b > 0 else None


def _nnls_rel(x, y, target=None):
    """Non-negative least squares of relative error (rows weighted 1/y) of x @ coef against `target` (default y): the
    coefficients, a dropped term 0."""
    from scipy.optimize import nnls

    coef, _ = nnls(x / y[:, None], (y if target is None else target) / y)
    return coef


def _moe(pd, path: str, gpu: dict, version: str) -> dict:
    """Per expert dtype: the fused MoE op's fixed cost, cost per expert read, and memory/compute efficiencies."""
    import numpy as np

    df = pd.read_parquet(path)
    df = df[(df["moe_tp_size"] == 1) & (df["moe_ep_size"] == 1)]
    out: dict = {}
    keys = ["num_tokens", "hidden_size", "inter_size", "topk", "num_experts"]
    for dtype, wbytes in MOE_BYTES.items():
        d = df[(df["moe_dtype"] == dtype) & (df["distribution"] == "balanced")]
        if d.empty:
            continue
        kernels = sorted(set(d["kernel_source"]))
        d = d.groupby(keys, as_index=False)["latency"].min()
        skew = df[(df["moe_dtype"] == dtype) & (df["distribution"] == MOE_PREFILL_ROUTING)]
        skew = skew.groupby(keys)["latency"].min()
        d["latency_skew"] = [skew.get(tuple(r), float("nan")) for r in d[keys].itertuples(index=False)]
        params = (d["hidden_size"] * d["inter_size"] * 3).to_numpy(float)  # gate, up, down
        n, k, e = (d[c].to_numpy(float) for c in ("num_tokens", "topk", "num_experts"))
        read = np.minimum(e, n * k)
        mem_ms = read * params * wbytes / gpu["mem_bw"] * 1e3
        peak = gpu.get(MOE_PEAK.get(dtype, "bfloat16_tc_flops")) or gpu.get("fp8_tc_flops")
        if not peak:
            continue
        comp_ms = 2 * n * k * params / peak * 1e3
        lat = d["latency"].to_numpy(float)
        small, large = (n <= 64) & (n * k <= e), n >= 2048
        if small.sum() < 3 or not large.any():
            continue
        # bytes at most at the datasheet bandwidth; what a row takes beyond that is a fixed cost, a cost per expert
        # touched (each expert's GEMMs and weight dequantization set up on their own: SGLang's MXFP4 kernel) and a
        # share of the bytes, by relative non-negative least squares on that remainder
        fixed, per_expert, over = _nnls_rel(np.c_[np.ones(small.sum()), read[small], mem_ms[small]], lat[small],
                                            lat[small] - mem_ms[small])
        inv_mem = 1 + over
        left = d["latency_skew"].to_numpy(float)[large] - fixed
        effs = sorted(c / t for c, t in zip(comp_ms[large], left, strict=True) if t > 0)
        if not effs:
            continue
        out[f"moe.{dtype}"] = {"version": version, "kernels": kernels, "fixed_ms": float(fixed),
                               "mem_efficiency": float(1 / inv_mem), "per_expert_ms": float(per_expert),
                               "compute_efficiency": float(effs[len(effs) // 2]), "peak_flops": float(peak),
                               "rows": [int(small.sum()), int(large.sum())]}
    return out


def _moe_curves(pd, path: str, routing: str, tokens: tuple[int, ...]):
    """(dtype, "hidden/inter/topk/experts", "moe_tp/ep", latency by token count) of each expert shape and moe_tp/EP the
    table times under `routing` at `tokens`, within MOE_ROW_GPUS and the dtypes trtkv prices."""
    df = pd.read_parquet(path)
    df = df[(df["distribution"] == routing) & df["num_tokens"].isin(tokens)
            & (df["moe_tp_size"] * df["moe_ep_size"] <= MOE_ROW_GPUS) & df["moe_dtype"].isin(list(MOE_BYTES))]
    keys = ["moe_dtype", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size"]
    for key, d in df.groupby(keys):
        shape, par = "/".join(str(int(v)) for v in key[1:5]), f"{int(key[5])}/{int(key[6])}"
        yield key[0], shape, par, d.groupby("num_tokens")["latency"].min()


def _moe_rows(pd, path: str) -> dict:
    """Per expert dtype, shape and moe_tp/EP: the fused MoE op's latency (ms) at MOE_ROW_TOKENS, prefill routing."""
    out: dict = {}
    for dtype, shape, par, got in _moe_curves(pd, path, MOE_PREFILL_ROUTING, MOE_ROW_TOKENS):
        if len(got) < len(MOE_ROW_TOKENS):  # a partial curve: the per-dtype fit prices that shape
            continue
        out.setdefault(dtype, {}).setdefault(shape, {})[par] = [float(f"{got[n]:.4g}") for n in MOE_ROW_TOKENS]
    return out


def _moe_decode_rows(pd, path: str) -> dict:
    """Per expert dtype, shape and moe_tp/EP: the fused MoE op's latency (ms) at MOE_DECODE_TOKENS, balanced routing,
    up to the first token count that reads every expert."""
    out: dict = {}
    for dtype, shape, par, got in _moe_curves(pd, path, MOE_DECODE_ROUTING, MOE_DECODE_TOKENS):
        topk, experts = (int(v) for v in shape.split("/")[2:4])
        curve = []
        for n in MOE_DECODE_TOKENS:
            if n not in got.index:
                break
            curve.append(float(f"{got[n]:.4g}"))
            if n * topk >= experts:
                break
        if len(curve) < 2:  # the per-dtype fit prices that shape
            continue
        out.setdefault(dtype, {}).setdefault(shape, {})[par] = curve
    return out


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


def _custom_allreduce(pd, comm_dir: str, version: str, intra_bw: float) -> dict:
    """The engine's own all-reduce per GPU count: floor and bus efficiency over every message size of its table."""
    import numpy as np

    mv = version if os.path.exists(os.path.join(comm_dir, version, "custom_allreduce_perf.parquet")) else _newest(
        comm_dir, "custom_allreduce_perf.parquet")
    if mv is None:
        return {}
    df = pd.read_parquet(os.path.join(comm_dir, mv, "custom_allreduce_perf.parquet"))
    df = df[(df["op_name"] == "all_reduce") & (df["allreduce_dtype"] == "bfloat16")]
    graph = df[df["kernel_source"].str.contains("graph")]
    df = graph if not graph.empty else df
    by_gpus: dict = {}
    for n, d in df.groupby("num_gpus"):
        d = d.groupby("message_size", as_index=False)["latency"].min()
        size, lat = d["message_size"].to_numpy(float), d["latency"].to_numpy(float)
        if len(d) < 3:
            continue
        ideal_ms = 2 * (n - 1) / n * size * 2 / intra_bw * 1e3  # bfloat16 elements at the YAML's bandwidth
        floor, inv_eff = _nnls_rel(np.c_[np.ones(len(d)), ideal_ms], lat)
        if inv_eff <= 0:
            continue
        by_gpus[str(int(n))] = {"floor_ms": float(floor), "bus_efficiency": float(1 / inv_eff), "rows": len(d)}
    if not by_gpus:
        return {}
    return {"custom_allreduce": {"version": mv, "kernels": sorted(set(df["kernel_source"])), "by_gpus": by_gpus}}


def main(argv: list[str]) -> int:
    import aiconfigurator_core
    import pandas as pd
    import yaml

    rows_path = argv[argv.index("--moe-rows") + 1] if "--moe-rows" in argv else None
    decode_path = argv[argv.index("--moe-decode-rows") + 1] if "--moe-decode-rows" in argv else None
    rows: dict = {}
    decode: dict = {}
    sys_dir = os.path.join(os.path.dirname(aiconfigurator_core.__file__), "systems")
    out: dict = {"aiconfigurator_core": importlib.metadata.version("aiconfigurator-core"), "shapes": __doc__.split(
        "Reference shapes")[1].strip(), "systems": {}, "datasheets": {}}
    for name in DATASHEET_ONLY:
        with open(os.path.join(sys_dir, f"{name}.yaml")) as f:
            spec = yaml.safe_load(f)
        out["datasheets"][name] = {"gpu": {k: spec["gpu"].get(k) for k in GPU_KEYS},
                                   "intra_node_bw": spec["node"]["intra_node_bw"]}
    for name in SYSTEMS:
        with open(os.path.join(sys_dir, f"{name}.yaml")) as f:
            spec = yaml.safe_load(f)
        gpu, node = spec["gpu"], spec["node"]
        root = os.path.join(sys_dir, spec["data_dir"])
        entry: dict = {"gpu": {k: gpu.get(k) for k in GPU_KEYS},
                       "intra_node_bw": node["intra_node_bw"], "backends": {}}
        entry.update(_allreduce(pd, root, gpu, node["intra_node_bw"]))
        for backend in BACKENDS:
            gv = _newest(os.path.join(root, "gemm", backend), "gemm_perf.parquet")
            av = _newest(os.path.join(root, "attention", backend), "generation_attention_perf.parquet")
            if gv is None or av is None:
                continue
            figures = _gemm(pd, os.path.join(root, "gemm", backend, gv, "gemm_perf.parquet"), gpu)
            figures.update(_attention(pd, os.path.join(root, "attention", backend, av), gpu))
            moe_dir = os.path.join(root, "moe", backend)
            mv = gv if os.path.exists(os.path.join(moe_dir, gv, "moe_perf.parquet")) else _newest(
                moe_dir, "moe_perf.parquet")
            if mv is not None:
                figures.update(_moe(pd, os.path.join(moe_dir, mv, "moe_perf.parquet"), gpu, mv))
                if rows_path:
                    rows[f"{name}/{backend}"] = {"version": mv, **_moe_rows(pd, os.path.join(moe_dir, mv,
                                                                                           "moe_perf.parquet"))}
                if decode_path:
                    decode[f"{name}/{backend}"] = {"version": mv, **_moe_decode_rows(
                        pd, os.path.join(moe_dir, mv, "moe_perf.parquet"))}
            figures.update(_custom_allreduce(pd, os.path.join(root, "comm", backend), gv, node["intra_node_bw"]))
            entry["backends"][backend] = {"gemm_version": gv, "attention_version": av, **figures}
        out["systems"][name] = entry
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    for path, tables, routing, tokens in ((rows_path, rows, MOE_PREFILL_ROUTING, MOE_ROW_TOKENS),
                                          (decode_path, decode, MOE_DECODE_ROUTING, MOE_DECODE_TOKENS)):
        if path:  # one line per engine table: ~10,000 curves
            with open(path, "w") as f:
                f.write(json.dumps({"aiconfigurator_core": out["aiconfigurator_core"], "routing": routing,
                                    "tokens": list(tokens), "max_gpus": MOE_ROW_GPUS}, sort_keys=True)[:-1])
                for i, (table, entry) in enumerate(sorted(tables.items())):
                    f.write(f',\n "{table}": ' if i else f', "tables": {{\n "{table}": ')
                    f.write(json.dumps(entry, sort_keys=True, separators=(",", ":")))
                f.write("\n }}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
