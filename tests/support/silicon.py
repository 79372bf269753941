"""trtkv's step model beside NVIDIA's measured runs that aiconfigurator-core gates its own accuracy on
(aiconfigurator_core/systems/silicon_sample.csv; issue #49): evidence, not the held set of tests/plan/
test_published_speed.py, since the rows name engine version, GPU, parallelism, lengths and concurrency but not the KV
dtype, speculative decoding or how the client sent requests (TTFT, which depends on arrival, is not judged; KV is taken
as FP8). Shared by tests/plan/test_silicon_samples.py (the slices in tests/data/silicon_samples/) and
scripts/silicon_samples.py (any slice of the installed file)."""

from __future__ import annotations

import csv
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from tests.support import speed_cases as sc

ROOT = Path(__file__).resolve().parents[2]
SUBSET = ROOT / "tests" / "data" / "silicon_samples" / "silicon_sample_moe.csv"
GPUS = {system: gpu for gpu, system in sc.GPUS.items()}
ENGINES = {"trtllm": "llmapi", "vllm": "vllm", "sglang": "sglang"}
NODE = 8  # GPUs of one node: multi-node wide EP is outside trtkv's step model


@dataclass(frozen=True)
class Slice:
    """One model on one system and engine at one ISL/OSL, its rows picked by the expert quantization they name."""

    model: str  # the end of model_path, e.g. "gpt-oss-120b"
    config: str  # trtkv's model config for it (tests/data/configs)
    system: str
    backend: str
    moe_quant: str
    isl: int = 1024
    osl: int = 1024
    # the activations of MXFP4 experts as the runs' launch script set them (build.moe_activations; auto: the
    # engine's own, trtkv.recipe.moe_activations)
    moe_activations: str = "auto"


GPT_OSS, DEEPSEEK = "tests/data/configs/gpt_oss_120b", "tests/data/configs/deepseek_v3"
# the slices tests/data/silicon_samples/ holds (scripts/silicon_samples.py --extract writes their rows); gpt-oss-120b's
# MXFP4 experts are filed as nvfp4
SLICES = (
    Slice("gpt-oss-120b", GPT_OSS, "b200_sxm", "trtllm", "nvfp4"),
    Slice("gpt-oss-120b", GPT_OSS, "h200_sxm", "trtllm", "nvfp4"),
    Slice("gpt-oss-120b", GPT_OSS, "h200_sxm", "vllm", "nvfp4"),
    Slice("gpt-oss-120b", GPT_OSS, "h100_sxm", "vllm", "nvfp4"),
    # InferenceX's B200 vLLM gpt-oss script, with the v0.15.1 image these rows name (SemiAnalysisAI/InferenceX
    # d2c2acb19, benchmarks/single_node/gptoss_fp4_b200.sh): `export VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1`, where
    # vLLM's default on Blackwell is BF16 activations (15 of 22 within 25% priced so, median +14.7%)
    Slice("gpt-oss-120b", GPT_OSS, "b200_sxm", "vllm", "nvfp4", moe_activations="mxfp8"),
    Slice("DeepSeek-R1", DEEPSEEK, "h200_sxm", "trtllm", "fp8"),
    Slice("DeepSeek-R1", DEEPSEEK, "h200_sxm", "sglang", "fp8_block"),
    Slice("DeepSeek-R1", DEEPSEEK, "b200_sxm", "sglang", "fp8_block"),
    # the same slices at 8K in / 1K out (long prompts: attention over the KV cache weighs more) and 1K in / 8K out (long
    # decodes), where the file has them; not DeepSeek-R1 FP8 on B200 under TensorRT-LLM: its TP8 rows name the image of
    # InferenceX's MTP configuration (1.2.0rc6.post3, dsr1-fp8-b200-trt-mtp in .github/configs/nvidia-master.yaml at
    # d7dbd045b, the day they were measured), and speculative decoding is outside trtkv's step model
    *(Slice(model, config, system, backend, quant, isl, osl, acts)
      for isl, osl in ((8192, 1024), (1024, 8192))
      for model, config, system, backend, quant, acts in (
          ("gpt-oss-120b", GPT_OSS, "b200_sxm", "trtllm", "nvfp4", "auto"),
          ("gpt-oss-120b", GPT_OSS, "h200_sxm", "trtllm", "nvfp4", "auto"),
          ("gpt-oss-120b", GPT_OSS, "h200_sxm", "vllm", "nvfp4", "auto"),
          ("gpt-oss-120b", GPT_OSS, "h100_sxm", "vllm", "nvfp4", "auto"),
          ("gpt-oss-120b", GPT_OSS, "b200_sxm", "vllm", "nvfp4", "mxfp8"),
          ("DeepSeek-R1", DEEPSEEK, "h200_sxm", "trtllm", "fp8", "auto"),
          ("DeepSeek-R1", DEEPSEEK, "h200_sxm", "sglang", "fp8_block", "auto"),
          ("DeepSeek-R1", DEEPSEEK, "b200_sxm", "sglang", "fp8_block", "auto"))),
)


def read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def in_slice(row: dict[str, str], s: Slice) -> bool:
    return (row["mode"] == "agg" and row["model_path"].endswith("/" + s.model) and row["system"] == s.system
            and row["backend"] == s.backend and int(row["isl"]) == s.isl and int(row["osl"]) == s.osl
            and row["moe_quant_mode"] == s.moe_quant)


def layout(row: dict[str, str]) -> tuple[int, int, int, int, int]:
    """(concurrency, tp, attention_dp, moe_tp, ep) of one row."""
    conc = re.search(r"silicon_concurrency=(\d+)", row["silicon_data_source"])
    tp, adp, moe_tp, ep = (int(float(row[f] or 1)) for f in ("tp_size", "attention_dp_size", "moe_tp_size",
                                                             "moe_ep_size"))
    return int(conc.group(1)) if conc else 0, tp, adp, moe_tp, ep


def kept(rows: list[dict[str, str]], s: Slice) -> dict[tuple[int, ...], dict[str, str]]:
    """The slice's rows trtkv can compare, by layout: one replica (concurrency = batch_size x attention_dp) on one node
    whose parallelism adds up (moe_tp x ep = tp x attention_dp <= 8); a measurement the file lists under two or more
    layouts is dropped as ambiguous."""
    mine = [r for r in rows if in_slice(r, s)]

    def figures(r: dict[str, str]) -> tuple[float, float]:
        return round(float(r["silicon_ttft_ms"]), 3), round(float(r["silicon_tpot_ms"]), 3)

    layouts: dict[tuple[float, float], set[tuple[int, ...]]] = defaultdict(set)
    for r in mine:
        layouts[figures(r)].add(layout(r))
    out: dict[tuple[int, ...], dict[str, str]] = {}
    for r in mine:
        conc, tp, adp, moe_tp, ep = lay = layout(r)
        one = conc == int(float(r["batch_size"])) * adp and moe_tp * ep == tp * adp <= NODE
        if one and len(layouts[figures(r)]) == 1:
            out.setdefault(lay, r)
    return out


def comparisons(rows: list[dict[str, str]], s: Slice) -> list[dict[str, float | int | str]]:
    """One row per kept measurement: its layout, version, measured TPOT/TTFT and trtkv's, TPOT's error."""
    out: list[dict[str, float | int | str]] = []
    setup = {"model_config": s.config, "backend": ENGINES[s.backend], "weights": "none",
             "moe_activations": s.moe_activations}
    for (conc, tp, adp, moe_tp, ep), r in sorted(kept(rows, s).items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0])):
        m = {"gpu": GPUS[s.system], "tp": tp, "ep": ep, "attention_dp": adp, "input_tokens": s.isl,
             "output_tokens": s.osl, "concurrency": conc, "max_num_batched_tokens": 8192, "arrival": "staggered"}
        got = sc.step_model_figures(setup, m, "fp8")
        tpot = float(r["silicon_tpot_ms"])
        out.append({"tp": tp, "attention_dp": adp, "moe_tp": moe_tp, "ep": ep, "concurrency": conc,
                    "version": r["backend_version"] or "?", "tpot_ms": tpot, "trtkv_tpot_ms": got["tpot_p50_ms"],
                    "error": got["tpot_p50_ms"] / tpot - 1, "ttft_ms": float(r["silicon_ttft_ms"]),
                    "trtkv_ttft_ms": got["ttft_p50_ms"]})
    return out
