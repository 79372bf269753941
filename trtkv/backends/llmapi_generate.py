"""`trtkv generate` on the llmapi backend: trtkv's CPU `LLM` (trtkv.runtime.llm) on the HF export
here, or a job that runs TensorRT-LLM's `LLM` with the recipe's LLM() arguments where TensorRT-LLM
is installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtkv.backends.base import RefusingRunner
from trtkv.backends.llmapi_args import llm_args
from trtkv.core.errors import StageError
from trtkv.recipe import Recipe
from trtkv.recipe.layout import HF, checkpoint_dir

CPU_MODULE = "trtkv.runtime.llm"
LLMAPI_RUNNER = """\
import json, sys
from tensorrt_llm import LLM, SamplingParams
a = json.loads(sys.argv[1])
llm = LLM(**a["llm_args"])
out = llm.generate([a["prompt"]], SamplingParams(max_tokens=a["max_tokens"], temperature=0.0))
print("TRTKV_TEXT"); print(out[0].outputs[0].text)
"""


class LlmApiRunner(RefusingRunner):
    def describe_local_generate(
        self, recipe: Recipe, max_tokens: int, checkpoint: Path | None
    ) -> str:
        return (
            f"{CPU_MODULE}.LLM on {checkpoint or checkpoint_dir(recipe) / HF} (the HF export; CPU, "
            f"greedy, {max_tokens} tokens)"
        )

    def local_generate(
        self, recipe: Recipe, prompt: str, max_tokens: int, checkpoint: Path | None
    ) -> str:
        from trtkv.runtime.llm import LLM
        from trtkv.runtime.llm_request import SamplingParams

        hf = Path(checkpoint) if checkpoint is not None else checkpoint_dir(recipe) / HF
        if not (hf / "config.json").is_file():
            raise StageError(
                f"{hf}: no config.json (the HF export). Next: `trtkv calibrate {recipe.name}`."
            )
        llm = LLM(**{**llm_args(recipe, hf), "model": str(hf)})
        try:
            return str(
                llm.generate_async(prompt, SamplingParams(max_tokens=max_tokens, temperature=0))
                .result()
                .outputs[0]
                .text
            )
        finally:
            llm.shutdown()

    def generate_job(
        self, recipe: Recipe, prompt: str, max_tokens: int
    ) -> tuple[str, dict[str, Any]]:
        return LLMAPI_RUNNER, {
            "llm_args": llm_args(recipe, checkpoint_dir(recipe) / HF),
            "prompt": prompt,
            "max_tokens": max_tokens,
        }
