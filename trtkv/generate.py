"""`trtkv generate`: greedy generation from a recipe's built engine, without a server.

- `reference`: trtkv's CPU runtime on the TensorRT-LLM checkpoint, read with TensorRT-LLM's defaults (so a
  checkpoint TensorRT-LLM would misread, e.g. without `rotary_base`, generates garbage here too).
- `tensorrt`: TensorRT-LLM's own `tensorrt_llm.runtime.ModelRunnerCpp` (the C++ executor Triton's backend runs, as
  its examples/run.py uses) on the engine (world size 1), where TensorRT-LLM lives (trtkv.trtllm: TRTKV_TRTLLM_PYTHON,
  this python, or the container).
- `pytorch` (LLM API): `tensorrt_llm.LLM` on the HF export with the recipe's KV dtype, in the same place.
The GPU paths are written from TensorRT-LLM 1.2's APIs and were not executed on a machine without a GPU.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from trtkv import layout, trtllm, versions
from trtkv.errors import StageError
from trtkv.recipe import Backend, Recipe

# Runs inside the TensorRT-LLM environment: argv[1] is a JSON object; prints the text after a marker line.
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
"""
LLMAPI_RUNNER = """\
import json, sys
from tensorrt_llm import LLM, SamplingParams
from tensorrt_llm.llmapi import KvCacheConfig
a = json.loads(sys.argv[1])
llm = LLM(model=a["hf"], tensor_parallel_size=a["tp"], pipeline_parallel_size=a["pp"],
          kv_cache_config=KvCacheConfig(dtype=a["kv_dtype"], free_gpu_memory_fraction=a["kv_fraction"]))
out = llm.generate([a["prompt"]], SamplingParams(max_tokens=a["max_tokens"], temperature=0.0))
print("TRTKV_TEXT"); print(out[0].outputs[0].text)
"""
MARKER = "TRTKV_TEXT"


def _gpu_job(recipe: Recipe, prompt: str, max_tokens: int) -> tuple[str, dict[str, Any]]:
    """The runner script and its arguments for a GPU backend."""
    ckpt, engine = layout.checkpoint_dir(recipe), layout.engine_dir(recipe)
    if recipe.build.backend is Backend.TENSORRT:
        if recipe.world_size != 1:
            raise StageError(f"generate {recipe.name}: the engine has {recipe.world_size} ranks; ModelRunner needs one "
                             f"process per rank (`mpirun -n {recipe.world_size}`). Next: serve it (`trtkv serve "
                             f"{recipe.name}`) and ask the server.")
        return ENGINE_RUNNER, {"engine": str(engine), "tokenizer": str(ckpt / "tokenizer"), "prompt": prompt,
                               "max_tokens": max_tokens}
    kv = layout.kv_cache_quant_algo(recipe)
    return LLMAPI_RUNNER, {"hf": str(ckpt / "hf"), "tp": recipe.build.tp_size, "pp": recipe.build.pp_size,
                           "kv_dtype": "fp8" if kv == "FP8" else "auto",
                           "kv_fraction": recipe.triton.kv_cache_free_gpu_mem_fraction,
                           "prompt": prompt, "max_tokens": max_tokens}


def describe(recipe: Recipe, prompt: str, max_tokens: int, checkpoint: Path | None = None) -> list[str]:
    """What `generate` would run (nothing is loaded)."""
    if recipe.build.backend is Backend.REFERENCE:
        ckpt = checkpoint or layout.checkpoint_dir(recipe)
        return [f"reference runtime: {layout.engine_dir(recipe)}/runtime.json on checkpoint {ckpt} (CPU, greedy, "
                f"{max_tokens} tokens)"]
    script, args = _gpu_job(recipe, prompt, max_tokens)
    image = versions.image_for_recipe(recipe)
    place = trtllm.where(image)
    cmd = place.python_command(["-c", "<runner>", json.dumps(args)])
    return [f"TensorRT-LLM runner ({place.kind}: {place.why}):", "  $ " + " ".join(cmd), "runner:", script]


def generate(recipe: Recipe, prompt: str, max_tokens: int = 16, *, checkpoint: Path | None = None) -> str:
    """The generated text (prompt excluded)."""
    if max_tokens < 1:
        raise StageError(f"--max-tokens {max_tokens}: must be >= 1.")
    if recipe.build.backend is Backend.REFERENCE:
        from trtkv.runtime import ReferenceRuntime

        engine = layout.engine_dir(recipe)
        if not (engine / "runtime.json").is_file():
            raise StageError(f"{engine}/runtime.json: missing. Next: `trtkv build {recipe.name}` (after `trtkv "
                             f"calibrate {recipe.name}`), or `make engine RECIPE={recipe.name}`.")
        if checkpoint is not None and not (Path(checkpoint) / "config.json").is_file():
            raise StageError(f"--checkpoint {checkpoint}: no config.json there (a TensorRT-LLM checkpoint folder).")
        runtime = ReferenceRuntime.load(engine, checkpoint=checkpoint)
        return runtime.generate_text(prompt, max_tokens=max_tokens)
    script, args = _gpu_job(recipe, prompt, max_tokens)
    image = versions.image_for_recipe(recipe)
    place = trtllm.where(image)
    if place.kind == "missing":
        raise StageError(f"generate {recipe.name}: TensorRT-LLM is not available here ({place.why}). Next: "
                         f"{trtllm.install_hint(image)}.")
    proc = subprocess.run(place.python_command(["-c", script, json.dumps(args)]), capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0 or MARKER not in proc.stdout:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-20:])
        raise StageError(f"generate {recipe.name}: the TensorRT-LLM runner failed (exit {proc.returncode}):\n{tail}")
    return proc.stdout.split(MARKER + "\n", 1)[1].rstrip("\n")
