"""Backend `tensorrt`: `trtllm-build` engines for TensorRT-LLM 1.0-1.2 (the engine path; removed
after 1.3.0rc20), served by Triton's C++ `tensorrtllm` backend in the version matrix's container,
one tritonserver per rank.

The KV cache precision is never a `trtllm-build` flag: it is the checkpoint's
`quantization.kv_cache_quant_algo`. TensorRT-LLM runs where trtkv.platform.trtllm finds it
(TRTKV_TRTLLM_PYTHON, this python, or the container).

This module holds the trtllm-build command, the build and the backend's parts; the checks before the
build are trtkv.backends.tensorrt_preflight's, the hints for a failed build's log
trtkv.backends.tensorrt_pitfalls'.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtkv.backends.base import (
    BUILD_SECTIONS,
    STREAM_STEP,
    EnsembleLayout,
    RefusingRunner,
    TritonServing,
    command_block,
    failed_log_path,
    trtllm_served,
)
from trtkv.backends.seam import EngineBackend, MemoryRule
from trtkv.backends.tensorrt_pitfalls import pitfall_hints
from trtkv.backends.tensorrt_preflight import TRTLLM_MAX, TRTLLM_MIN, preflight_tensorrt
from trtkv.core.errors import StageError, ToolError
from trtkv.core.tools import quote, run_logged, tail
from trtkv.engines.kv_tiers import engine_host_tier
from trtkv.engines.trtllm import (
    engine_batch_limit,
    engine_memory_knobs,
    trt_engine_at,
    trt_engine_recipe_pool,
    trtllm_token_unit,
)
from trtkv.platform import trtllm, versions
from trtkv.recipe import Backend, KVCacheQuant, Recipe, WeightQuant
from trtkv.recipe.backend_rules import gemm_plugin_choice
from trtkv.recipe.layout import checkpoint_tokenizer_dir, engine_dir, kv_cache_quant_algo

ENGINE_RUNNER = """\
import json, sys
from tensorrt_llm.runtime import ModelRunnerCpp
from transformers import AutoTokenizer
a = json.loads(sys.argv[1])
tok = AutoTokenizer.from_pretrained(a["tokenizer"])
end = tok.eos_token_id
if end is None:
    sys.exit("the tokenizer in " + a["tokenizer"] + " names no eos token: TensorRT-LLM needs an end id")
ids = tok(a["prompt"], add_special_tokens=True, return_tensors="pt")["input_ids"][0].int()
runner = ModelRunnerCpp.from_dir(engine_dir=a["engine"], rank=0, max_batch_size=1, max_input_len=len(ids),
                                 max_output_len=a["max_tokens"], max_beam_width=1)
pad = tok.pad_token_id if tok.pad_token_id is not None else end
out = runner.generate([ids], max_new_tokens=a["max_tokens"], end_id=end, pad_id=pad, temperature=1.0, top_k=1,
                      output_sequence_lengths=True, return_dict=True)
length = int(out["sequence_lengths"][0][0])
print("TRTKV_TEXT"); print(tok.decode(out["output_ids"][0][0][len(ids):length].tolist(), skip_special_tokens=True))
"""  # noqa: E501
TRTLLM_DEFAULT_TOKENS_PER_BLOCK = 32  # PluginConfig.tokens_per_block default in TensorRT-LLM 1.x
BUILD_LOG = "build.log"
BUILD_COMMAND = "build_command.txt"


# ---------------------------------------------------------------------------------------------
# The trtllm-build command (a pure function of the recipe: the dry run and the real run print the
# same thing)


def gemm_plugin(recipe: Recipe) -> str:
    """`--gemm_plugin`: the recipe's value; `auto` as TensorRT-LLM's performance guide sets it
    (trtkv.recipe.backend_rules.gemm_plugin_choice)."""
    return gemm_plugin_choice(recipe)[0]


def _onoff(flag: bool) -> str:
    return "enable" if flag else "disable"


def trtllm_build_command(recipe: Recipe, ckpt: Path, output: Path) -> list[str]:
    """The `trtllm-build` argument list; every flag exists in TensorRT-LLM 1.2 (tests check the
    list)."""
    b = recipe.build
    cmd = [
        "trtllm-build",
        "--checkpoint_dir",
        str(ckpt),
        "--output_dir",
        str(output),
        "--max_batch_size",
        str(b.max_batch_size),
        "--max_input_len",
        str(b.max_input_len),
        "--max_seq_len",
        str(b.max_seq_len),
        "--max_num_tokens",
        str(b.max_num_tokens),
        "--gemm_plugin",
        gemm_plugin(recipe),
        "--gpt_attention_plugin",
        "auto",
        "--kv_cache_type",
        "paged",
        "--use_paged_context_fmha",
        _onoff(recipe.paged_context_fmha),
        "--use_fp8_context_fmha",
        _onoff(recipe.fp8_context_fmha),
        "--remove_input_padding",
        "enable",
        # the Triton configs declare FP32 logits (context/generation_logits outputs)
        "--logits_dtype",
        "float32",
        "--multiple_profiles",
        _onoff(b.multiple_profiles),
        "--workers",
        str(recipe.world_size),
    ]
    if b.tokens_per_block != TRTLLM_DEFAULT_TOKENS_PER_BLOCK:
        cmd += ["--tokens_per_block", str(b.tokens_per_block)]
    return cmd


def context_fmha_line(recipe: Recipe) -> str:
    """Why the two context-FMHA flags have the values they have (TensorRT-LLM's own rules)."""
    kv, w = recipe.quantization.kv_cache, recipe.quantization.weights
    paged = _onoff(recipe.paged_context_fmha)
    if kv is KVCacheQuant.INT8:
        why_paged = "forced off: paged context FMHA doesn't work with an INT8 KV cache"
    elif kv is KVCacheQuant.FP8 and w is not WeightQuant.FP8:
        why_paged = (
            "forced off: FP8 paged context FMHA needs the FP8 quantization workflow (FP8 weights)"
        )
    else:
        why_paged = (
            f"build.use_paged_context_fmha = {str(recipe.build.use_paged_context_fmha).lower()}"
        )
    fp8 = _onoff(recipe.fp8_context_fmha)
    why_fp8 = (
        "build.use_fp8_context_fmha"
        if recipe.build.use_fp8_context_fmha is not None
        else "default: on exactly when the KV cache and the weights are both FP8"
    )
    return (
        f"context FMHA: --use_paged_context_fmha {paged} ({why_paged}); --use_fp8_context_fmha "
        f"{fp8} ({why_fp8})"
    )


# ---------------------------------------------------------------------------------------------
# The build


def _build_tensorrt(
    recipe: Recipe,
    ckpt: Path,
    tmp: Path,
    final: Path,
    place: trtllm.TrtllmPlace,
) -> dict[str, Any]:
    """Run trtllm-build (where TensorRT-LLM lives) into `tmp`; keep the log beside the engine folder
    when it fails."""
    shown = trtllm_build_command(recipe, ckpt, final)
    plain = trtllm_build_command(recipe, ckpt, tmp)
    run = place.tool_command(plain[0], plain[1:])
    (tmp / BUILD_COMMAND).write_text(
        f"# {BUILDER.kv_source_line(recipe)}\n"
        f"# trtkv ran this with --output_dir {tmp} (a temporary sibling renamed to {final} on "
        f"success), {place.why}:\n# {quote(run)}\n" + quote(shown) + "\n"
    )
    log_path = tmp / BUILD_LOG
    try:
        run_logged(run, log_path)
    except ToolError as exc:
        kept = failed_log_path(recipe)
        if log_path.is_file():
            shutil.copyfile(log_path, kept)
        hints = pitfall_hints(tail(log_path, 200))
        extra = "".join(f"\nhint: {h}" for h in hints)
        message = str(exc).replace(str(log_path), str(kept))
        raise ToolError(
            f"build {recipe.name}: {message}\nno engine folder was written (full log: "
            f"{kept}).{extra}"
        ) from exc
    engines = [tmp / f"rank{r}.engine" for r in range(recipe.world_size)]
    missing = [p.name for p in engines if not p.is_file()]
    if missing or not (tmp / "config.json").is_file():
        raise StageError(
            f"build {recipe.name}: trtllm-build exited 0 but did not write "
            f"{', '.join(missing + ([] if (tmp / 'config.json').is_file() else ['config.json']))}. "
            f"Next: read {failed_log_path(recipe)}."
        )
    return {
        "backend": "tensorrt",
        "command": shown,
        "ran": run,
        "engines": [p.name for p in engines],
    }


# ---------------------------------------------------------------------------------------------
# The backend's parts


class TensorRTBuilder:
    sections = BUILD_SECTIONS

    def kv_source_line(self, recipe: Recipe) -> str:
        algo = kv_cache_quant_algo(recipe)
        flag = f"--{(algo or '<dtype>').lower()}_kv_cache"
        return (
            f"KV cache: {algo or 'unquantized'}, from checkpoint config "
            f"quantization.kv_cache_quant_algo — trtllm-build has no {flag} flag"
        )

    def prepare(self, recipe: Recipe) -> tuple[Path, dict[str, Any]]:
        info = preflight_tensorrt(recipe)
        return Path(info["checkpoint"]), info

    def build(
        self,
        recipe: Recipe,
        ckpt: Path,
        tmp: Path,
        final: Path,
        info: dict[str, Any],
        log: Callable[[str], None],
    ) -> dict[str, Any]:
        # the versions that built the engine: `trtkv repo/serve` pick the Triton image from them
        return {
            **_build_tensorrt(recipe, ckpt, tmp, final, info["place"]),
            "versions": info["versions"],
        }

    def dry_run_lines(self, recipe: Recipe, ckpt: Path, out: Path) -> list[str]:
        image = versions.image_for(recipe.build.tensorrt_llm_version)
        place = trtllm.where(image)
        row = versions.row_for_trtllm(recipe.build.tensorrt_llm_version)
        lines = [
            f"  TensorRT-LLM {recipe.build.tensorrt_llm_version} (TensorRT {row.tensorrt}; served "
            f"by {image}) runs where trtkv.platform.trtllm finds it: {place.why}"
            + (" -- nothing to run it with on this machine" if place.kind == "missing" else ""),
            f"  preflight: import tensorrt_llm there (version {recipe.build.tensorrt_llm_version}, "
            f">= {'.'.join(map(str, TRTLLM_MIN))} and < {'.'.join(map(str, TRTLLM_MAX))}); "
            f"`nvidia-smi -L` >= {recipe.world_size} GPU(s); {ckpt}/config.json has "
            f"kv_cache_quant_algo = {kv_cache_quant_algo(recipe)}, dtype = "
            f"{recipe.model.dtype.value}, mapping tp_size = {recipe.build.tp_size}, pp_size = "
            f"{recipe.build.pp_size}",
            "  " + context_fmha_line(recipe),
            f"  --gemm_plugin {gemm_plugin_choice(recipe)[1]}",
            f"  run (log: {out / BUILD_LOG}, command saved to {out / BUILD_COMMAND}):",
        ]
        plain = trtllm_build_command(recipe, ckpt, out)
        if place.kind != "missing":
            lines.append(
                f"  started as: {quote(place.tool_command(plain[0], []))} <the flags below>"
            )
        return lines + command_block(plain)


class TensorRTLayout(EnsembleLayout):
    llm_model = ("tensorrt_llm/config.tensorrt.pbtxt", None)
    # The C++ model streams one token per response and the (stateless) postprocessing model would
    # turn a multi-byte character split across two responses into U+FFFD; `tensorrt_llm_stream`
    # (trtkv's BLS model) calls it and re-cuts the stream on whole UTF-8 characters.
    llm_step_model = STREAM_STEP

    def summary(self, recipe: Recipe) -> str:
        t = recipe.triton
        return (
            f"backend `tensorrtllm`, engine `{engine_dir(recipe)}` ({t.batching_strategy.value}, "
            f"{t.batch_scheduler_policy.value})"
        )

    def notes(self, recipe: Recipe) -> list[str]:
        b = recipe.build
        if recipe.chunked_context:
            return [
                f"`enable_chunked_context` is true: build.max_input_len {b.max_input_len} exceeds "
                f"build.max_num_tokens {b.max_num_tokens}, and the batch manager rejects a longer "
                "context unless it may split it into chunks (this needs the engine's paged context "
                "FMHA, which `trtkv build` enables here).",
                "",
            ]
        return [
            "`enable_chunked_context` is false: every prompt (at most build.max_input_len "
            f"{b.max_input_len} tokens) fits in one engine step of build.max_num_tokens "
            f"{b.max_num_tokens}.",
            "",
        ]


class TensorRTServing(TritonServing):
    # the build manifest records the TensorRT-LLM/TensorRT that built the engine
    records_versions = True

    def ranks(self, recipe: Recipe) -> int:
        return recipe.world_size


class TensorRTRunner(RefusingRunner):
    def generate_job(
        self, recipe: Recipe, prompt: str, max_tokens: int
    ) -> tuple[str, dict[str, Any]]:
        if recipe.world_size != 1:
            raise StageError(
                f"generate {recipe.name}: the engine has {recipe.world_size} ranks; ModelRunnerCpp "
                f"needs one process per rank (`mpirun -n {recipe.world_size}`). Next: serve it "
                f"(`trtkv serve {recipe.name}`) and ask the server."
            )
        return ENGINE_RUNNER, {
            "engine": str(engine_dir(recipe)),
            "tokenizer": str(checkpoint_tokenizer_dir(recipe)),
            "prompt": prompt,
            "max_tokens": max_tokens,
        }


BUILDER = TensorRTBuilder()


BACKEND = EngineBackend(
    Backend.TENSORRT,
    BUILDER,
    TensorRTLayout(),
    TensorRTServing(),
    TensorRTRunner(),
    memory=MemoryRule(
        trt_engine_recipe_pool,
        engine_memory_knobs,
        served=trtllm_served,
        batch_limit=engine_batch_limit,
        tokens=trtllm_token_unit,
        host_tier=engine_host_tier,
        at_release=trt_engine_at,
    ),
)
