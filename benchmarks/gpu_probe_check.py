"""The probe's GPU check (issue 40): one command, under 4 minutes on one H200, every figure written to $OUT as it goes.

    python benchmarks/gpu_probe_check.py                 # on the GPU machine (make gpu-probe-check-wheels first)
    python benchmarks/gpu_probe_check.py --cpu-only      # its CPU half, here: the same checks that need no CUDA

On a random-weight Llama built from a config (8 layers, 16 query / 4 KV heads of head_dim 128: FA3's FP8 tiles differ
between prefill and decode at that head_dim), it
1. runs the probe's formats and attention modes (cache-only, vllm_fa3_fp8, trtllm_fp8_fmha_sm90) on CUDA and on the
   CPU in float32 over the same 2K tokens: the two devices must agree within the formats' tolerance (both put values
   on the same FP8 grid; float32 sums in another order move a value across a rounding boundary now and then, so the
   median |dlogp| must be float32-small and the KL figures equal to 2% of their size);
2. dispatches the layers over cuda:0 and the CPU (accelerate offload: the second half's weights live in host memory
   and are moved in per layer) and checks the pass equals the single-device one, the quantized cache of every layer
   on the device its layer ran;
3. runs bf16 passes at 8K, 16K and 32K per format and mode, printing time and peak memory per pass;
4. checks P's FP8 quantization against ModelOpt's p_bmm_quantizer (its Triton attention kernel with p_qdq="fp8":
   P x448 per 32-key tile, first tile first) on CUDA: trtkv's kernel_attention with the same tile, scale and order.
Needs torch, transformers and accelerate (in the GPU image) and, for step 4, nvidia-modelopt and the few packages it
imports that the image lacks: `make gpu-probe-check-wheels` downloads them into .whl/ (carried to the machine).
Writes $OUT/gpu_probe_check.json (rewritten after every step, so a cut-off run still reports) and $OUT/*.log.
Exit status 0 when every check that ran passed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from trtkv.kvcache.attention import kernel_attention  # noqa: E402
from trtkv.kvcache.attention_hook import EngineRun, engine_attention, q_scales_for  # noqa: E402
from trtkv.kvcache.attention_modes import CACHE_ONLY, load_attention  # noqa: E402
from trtkv.kvcache.cache import QuantizedKVCache  # noqa: E402

JOBS = [("fp16", CACHE_ONLY), ("fp8_scale1", CACHE_ONLY), ("fp8_scale1", "vllm_fa3_fp8"),
        ("fp8_scale1", "trtllm_fp8_fmha_sm90"), ("int8_token", CACHE_ONLY)]
KL_REL_TOL = 0.02  # device vs device, relative to the KL itself
MEDIAN_DLOGP_TOL = 1e-3  # float32 logits of a near-uniform random model: differences are ~1e-6 where no FP8 step flips


class Report:
    """The JSON document under $OUT, rewritten after every step."""

    def __init__(self, out: Path):
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.doc: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "steps": {}, "failures": []}
        self.log = open(out / "gpu_probe_check.log", "a")  # noqa: SIM115 - the run's log, closed at exit

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.log.write(text + "\n")
        self.log.flush()

    def step(self, name: str, result: Any, ok: bool = True) -> None:
        self.doc["steps"][name] = result
        if not ok:
            self.doc["failures"].append(name)
        self.say(f"[{'ok' if ok else 'FAIL'}] {name}: {json.dumps(result)[:600]}")
        (self.out / "gpu_probe_check.json").write_text(json.dumps(self.doc, indent=1))


def random_llama(layers: int, seed: int = 0):  # noqa: ANN201
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=layers,
                         num_attention_heads=16, num_key_value_heads=4, head_dim=128, max_position_embeddings=32768)
    model = LlamaForCausalLM(config).eval()
    model.config._attn_implementation = "sdpa"
    return model


def make_cache(model, fmt: str) -> QuantizedKVCache:  # noqa: ANN001
    n = model.config.num_hidden_layers
    ones = [1.0] * n
    return QuantizedKVCache(model.config, fmt, ones if fmt.startswith("fp8") else None,
                            ones if fmt.startswith("fp8") else None)


def run_pass(model, ids: torch.Tensor, fmt: str, mode: str, chunk: int | None = None) -> tuple[torch.Tensor, Any]:  # noqa: ANN001
    """Log-probabilities [T, vocab] (float32, on the CPU) of one probe pass, and the cache it filled."""
    cache = make_cache(model, fmt)
    outs = []
    step = chunk or ids.shape[1]
    with torch.inference_mode():
        ctx = (engine_attention(model, EngineRun(load_attention().mode(mode), cache, 0,
                                                 q_scales_for(cache, load_attention().mode(mode))))
               if mode != CACHE_ONLY else None)
        if ctx is not None:
            ctx.__enter__()
        try:
            for s in range(0, ids.shape[1], step):
                h = model.model(input_ids=ids[:, s:s + step], past_key_values=cache, use_cache=True).last_hidden_state
                outs.append(torch.log_softmax(model.lm_head(h[0]).float(), -1).cpu())
        finally:
            if ctx is not None:
                ctx.__exit__(None, None, None)
    return torch.cat(outs), cache


def kl(ref: torch.Tensor, q: torch.Tensor) -> float:
    return float((ref.exp() * (ref - q)).sum(-1).clamp(min=0).mean())


def step_devices(rep: Report, model, ids: torch.Tensor, cuda: bool) -> None:  # noqa: ANN001
    """Each (format, mode) on the CPU and on CUDA in float32: equal within the formats' tolerance."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cpu = {job: run_pass(model, ids, *job)[0] for job in JOBS}
    ref = cpu[JOBS[0]]
    result = {f"{f}@{m}": {"kl_cpu": kl(ref, lp)} for (f, m), lp in cpu.items()}
    ok = True
    if cuda:
        gpu_model = model.to("cuda")
        gpu = {job: run_pass(gpu_model, ids.cuda(), *job)[0] for job in JOBS}
        model.to("cpu")
        for (f, m), lp in gpu.items():
            row = result[f"{f}@{m}"]
            d = (lp - cpu[(f, m)]).abs()
            row.update(kl_cuda=kl(gpu[JOBS[0]], lp), median_abs_dlogp=float(d.median()), max_abs_dlogp=float(d.max()))
            row["ok"] = (row["median_abs_dlogp"] < MEDIAN_DLOGP_TOL
                         and abs(row["kl_cuda"] - row["kl_cpu"]) <= KL_REL_TOL * max(row["kl_cpu"], 1e-9) + 1e-7)
            ok &= row["ok"]
    rep.step("cpu_vs_cuda", {"tokens": ids.shape[1], "jobs": result, "ran_on_cuda": cuda}, ok)


def step_sharded(rep: Report, model, ids: torch.Tensor, cuda: bool, tmp: Path) -> None:  # noqa: ANN001
    """Layers split over cuda:0 and the CPU (accelerate offload) compute what one device does."""
    from transformers import AutoModelForCausalLM

    model.save_pretrained(tmp / "model")
    n = model.config.num_hidden_layers
    main = "cuda:0" if cuda else "cpu"
    second = "cpu" if cuda else "disk"  # on a machine without CUDA, the offload hooks move layers in from disk
    device_map = {"model.embed_tokens": main, "model.rotary_emb": main, "model.norm": main, "lm_head": main,
                  **{f"model.layers.{i}": (main if i < n // 2 else second) for i in range(n)}}
    placed = AutoModelForCausalLM.from_pretrained(tmp / "model", dtype=torch.float32, device_map=device_map,
                                                  offload_folder=str(tmp / "offload")).eval()
    placed.config._attn_implementation = "sdpa"
    single = model.to(main)
    t0 = time.time()
    want, _ = run_pass(single, ids.to(main), "fp8_scale1", "vllm_fa3_fp8")
    got, cache = run_pass(placed, ids.to(main), "fp8_scale1", "vllm_fa3_fp8")
    seconds = time.time() - t0
    model.to("cpu")
    devices = sorted({str(t.device) for layer in cache.qlayers for t in layer.k_store.view().values()})
    diff = float((got - want).abs().max())
    rep.step("sharded", {"device_map": {"first_half": main, "second_half": second}, "cache_devices": devices,
                         "max_abs_dlogp_vs_one_device": diff, "seconds": round(seconds, 2)},
             diff < 1e-4 and devices == [main if cuda else "cpu"])


def step_long(rep: Report, model, lengths: list[int], cuda: bool) -> None:  # noqa: ANN001
    """bf16 passes at each length: time and peak memory per pass, KL to the 16-bit reference."""
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    m = model.to(device=device, dtype=dtype)
    rows = []
    for n in lengths:
        ids = torch.randint(0, 32000, (1, n), generator=torch.Generator().manual_seed(n)).to(device)
        ref = None
        for fmt, mode in [("bf16" if cuda else "fp16", CACHE_ONLY), *JOBS[1:4]]:
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            t0 = time.time()
            lp, _ = run_pass(m, ids, fmt, mode, chunk=2048)
            if cuda:
                torch.cuda.synchronize()
            row = {"tokens": n, "format": fmt, "attention": mode, "seconds": round(time.time() - t0, 2),
                   "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None}
            ref = lp if ref is None else ref
            row["kl"] = kl(ref, lp)
            rows.append(row)
            rep.say(f"  pass {row}")
            del lp
        rep.step(f"long_{n}", rows[-4:])
    model.to(device="cpu", dtype=torch.float32)


def step_p_vs_modelopt(rep: Report, cuda: bool) -> None:
    """P's FP8 quantization against ModelOpt's p_bmm_quantizer (its Triton kernel, p_qdq='fp8', amax 1.0)."""
    if not cuda:
        rep.step("p_vs_modelopt", {"ran": False, "why": "ModelOpt's p_bmm_quantizer runs only in its CUDA Triton "
                                                        "kernel"})
        return
    try:
        from modelopt.torch.kernels.common.attention.triton_fa import attention as modelopt_attention
    except ImportError as exc:
        rep.step("p_vs_modelopt", {"ran": False, "why": f"modelopt not importable: {exc}; run make "
                                                        f"gpu-probe-check-wheels and carry .whl"}, False)
        return
    from dataclasses import replace

    torch.manual_seed(7)
    h, hkv, t, d = 16, 4, 2048, 128
    q = (torch.randn(t, h, d, device="cuda") * 2).bfloat16()
    k, v = torch.randn(t, hkv, d, device="cuda").bfloat16(), torch.randn(t, hkv, d, device="cuda").bfloat16()
    starts, lens = torch.tensor([0], device="cuda", dtype=torch.int32), torch.tensor([t], device="cuda", dtype=torch.int32)
    got = modelopt_attention(q, k, v, starts, lens, t, is_causal=True, p_qdq="fp8", p_qdq_amax=1.0).float()
    plain = modelopt_attention(q, k, v, starts, lens, t, is_causal=True).float()
    base = load_attention().mode("vllm_fa3_fp8").prefill
    kernel = replace(base, q="none", p_scale=448.0, tile_order="first_to_last")  # ModelOpt: P x 448/amax, tiles up
    allowed = torch.ones(t, t, dtype=torch.bool, device="cuda").tril()[None, None]
    want = kernel_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], allowed,
                            d ** -0.5, kernel, 1.0, 0, 32)[0].transpose(0, 1)  # BLOCK_N 32: _FWD_CONFIGS
    diff = (got - want).abs()
    effect = (got - plain).abs()
    bound = 2.0 ** -3 * float(v.float().abs().max())  # one E4M3 step of one P element moves O by at most this
    ok = float(diff.median()) < 0.05 * float(effect.median()) and float(diff.max()) <= bound
    rep.step("p_vs_modelopt", {"ran": True, "tokens": t, "median_abs_diff": float(diff.median()),
                               "max_abs_diff": float(diff.max()), "p_quant_effect_median": float(effect.median()),
                               "single_flip_bound": bound}, ok)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-only", action="store_true", help="the checks that need no CUDA (the CPU half), short")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_probe_check_out")))
    ap.add_argument("--lengths", default=None, help="long-pass lengths (default 8192,16384,32768; --cpu-only 512)")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.cpu_only
    rep = Report(args.out)
    env = {"torch": torch.__version__, "cuda": cuda, "threads": torch.get_num_threads()}
    if cuda:
        free, total = torch.cuda.mem_get_info()
        env.update(device=torch.cuda.get_device_name(), sm=list(torch.cuda.get_device_capability()),
                   free_gib=round(free / 2**30, 1), total_gib=round(total / 2**30, 1))
    rep.step("environment", env)
    lengths = [int(x) for x in (args.lengths or ("512" if not cuda else "8192,16384,32768")).split(",")]
    model = random_llama(8 if cuda else 4)
    ids = torch.randint(0, 32000, (1, 2048 if cuda else 256), generator=torch.Generator().manual_seed(1))
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn in [("cpu_vs_cuda", lambda: step_devices(rep, model, ids, cuda)),
                         ("sharded", lambda: step_sharded(rep, model, ids, cuda, Path(tmp))),
                         ("long", lambda: step_long(rep, model, lengths, cuda)),
                         ("p_vs_modelopt", lambda: step_p_vs_modelopt(rep, cuda))]:
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - a broken step is reported, the next ones still run
                rep.step(name, {"error": f"{type(exc).__name__}: {exc}"}, False)
    rep.doc["seconds"] = round(time.time() - t0, 1)
    rep.step("done", {"failures": rep.doc["failures"], "seconds": rep.doc["seconds"]}, not rep.doc["failures"])
    return 1 if rep.doc["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
