"""`trtkv init`'s engine settings: what it writes under quantization/build/hardware (weights, lengths, batch, tokens per
step), the calibration/bench/probe sections sized for the target (a GPU or the CPU), and the check that the text
validates for its engine and plans, in memory under the user's file name. A default the engine refuses is changed
where one field settles it (weights none -> fp8 for vLLM's ModelOpt loader, max_num_tokens raised to max_input_len for
trtllm-build without paged context FMHA); anything else is refused naming the user's file and the flag that set it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from trtkv.recipe import Recipe

DEFAULT_NUM_TOKENS = 8192  # tokens per engine step (vLLM's max_num_batched_tokens)
MAX_BATCH = 256  # the most sequences init sizes max_batch_size to (vLLM's max_num_seqs below 70 GiB); --concurrency
CPU_BATCH = 16  # the CPU's capacity is the host's RAM, so a fixed batch keeps the recipe the same on every machine
GPU_LENGTHS = (1024, 4096, 16384, 32768)  # needle haystacks and probe lengths on a GPU (as recipes/_base/gpu_serving)
CPU_LENGTHS = (512, 1024, 2048, 4096, 8192)  # the schema's probe lengths (a CPU forward pass per length)

# The init flag that sets each recipe field (a refusal names it); fields absent here are derived from these
FLAGS = {"quantization.weights": "--weights", "quantization.kv_cache": "--kv-cache", "build.backend": "--backend",
         "hardware.gpu": "--gpu", "hardware.count": "--count", "build.tp_size": "--count", "build.pp_size": "--count",
         "build.max_seq_len": "--max-seq-len", "build.max_input_len": "--max-seq-len",
         "build.max_batch_size": "--concurrency", "build.max_num_tokens": "--concurrency"}


@dataclass
class Settings:
    """The engine settings of one attempt: init changes weights/num_tokens/batch between attempts, never the flags."""

    gpu: str
    count: int
    kv: str
    weights: str
    backend: str
    seq_len: int
    batch: int
    num_tokens: int = DEFAULT_NUM_TOKENS
    why: dict[str, str] = field(default_factory=dict)  # field -> why init moved it off its default (a comment)

    @property
    def input_len(self) -> int:
        """Longest prompt: max_seq_len less an eighth kept for the answer."""
        return max(1, self.seq_len - max(1, self.seq_len // 8))


def engine_lines(s: Settings, tp: int, pp: int, mpe: int, on_cpu: bool) -> list[str]:
    """The quantization, build and hardware sections, each chosen value with where it came from."""
    weights = s.why.get("quantization.weights", "the checkpoint's own precision" if s.weights == "none" else "")
    batch = s.why.get("build.max_batch_size", "")
    tokens = s.why.get("build.max_num_tokens", "tokens per engine step (vLLM's max_num_batched_tokens)")
    return [
        "quantization:",
        f"  weights: {s.weights}" + (f"   # {_one_line(weights)}" if weights else ""),
        f"  kv_cache: {s.kv}",
        "build:",
        f"  backend: {s.backend}",
        f"  max_batch_size: {s.batch}" + (f"   # {_one_line(batch)}" if batch else ""),
        f"  max_input_len: {s.input_len}",
        f"  max_seq_len: {s.seq_len}                # up to max_position_embeddings {mpe}",
        f"  max_num_tokens: {s.num_tokens}   # {_one_line(tokens)}",
        f"  tp_size: {tp}",
        f"  pp_size: {pp}",
        "hardware:",
        f"  gpu: {s.gpu}",
        f"  count: {tp * pp}",
    ]


def section_lines(s: Settings, on_cpu: bool) -> list[str]:
    """calibration (GPU only: 512 x 512), bench and probe sized to the recipe's lengths and batch."""
    seq, inp = s.seq_len, s.input_len
    out: list[str] = []
    if not on_cpu:
        out += ["calibration:                       # GPU-sized, as recipes/_base/gpu_serving.yaml",
                "  num_samples: 512",
                f"  seq_len: {min(512, inp)}",
                "  batch_size: 8"]
    sweep = [c for c in (1, 2, 4) if c <= s.batch] if on_cpu else \
        [c for c in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if c < s.batch] + [s.batch]
    input_tokens = min(128 if on_cpu else 2048, inp)
    output_tokens = min(32 if on_cpu else 256, seq - input_tokens)
    lengths = GPU_LENGTHS if not on_cpu else (512,)
    needle = [n for n in lengths if n <= inp] or [inp]
    ruler = [n for n in (4096, 16384, 32768) if n <= seq] or [seq]
    out += ["bench:                             # the sweep up to max_batch_size; prompts within max_input_len",
            f"  concurrency: [{', '.join(map(str, sweep))}]",
            f"  input_tokens: {input_tokens}",
            f"  output_tokens: {output_tokens}",
            f"  num_requests: {max(16 if on_cpu else 64, 2 * sweep[-1])}",
            f"  warmup_requests: {2 if on_cpu else 4}",
            f"  needle_context_lengths: [{', '.join(map(str, needle))}]",
            f"  ruler_lengths: [{', '.join(map(str, ruler))}]"]
    probe = sorted({n for n in (CPU_LENGTHS if on_cpu else GPU_LENGTHS) if n <= seq} | ({seq} if not on_cpu else set()))
    out += ["probe:", f"  lengths: [{', '.join(map(str, probe or [seq]))}]   # up to max_seq_len"]
    return out


def check(name: str, out: Path, text: str) -> tuple[Recipe, list[tuple[str, str]]]:
    """The text validated as the recipe `out` (in memory: a schema error names the user's file), and the cross-field
    and engine rules it breaks."""
    from pydantic import ValidationError

    from trtkv.recipe import Recipe, cross_field_problems
    from trtkv.recipe.loader import validate_data
    from trtkv.recipe.plain_yaml import load_yaml

    data = load_yaml(text)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError:
        validate_data(data, {}, out)  # raises the RecipeError naming `out`
        raise
    recipe._name = name
    recipe._path = out
    return recipe, cross_field_problems(recipe)


def settle(name: str, out: Path, s: Settings, given: dict[str, str],
           render: Callable[[Settings], str]) -> tuple[str, Recipe]:
    """Render and check until the engine accepts the recipe, moving each default the rules refuse where that field
    alone settles it; otherwise a refusal of what is left (a moved field's problem as it was before the move)."""
    before: dict[str, str] = {}  # field -> the problem that made init move it
    for _attempt in range(3):
        text = render(s)
        recipe, problems = check(name, out, text)
        if not problems:
            return text, recipe
        moved = [where for where, msg in problems if where not in before and _move(s, where, msg, given)]
        before.update((where, msg) for where, msg in problems if where in moved)
        left = [(where, before.get(where, msg)) for where, msg in problems if where not in moved]
        if left or not moved:
            raise refusal(out, left or problems, given)
    raise refusal(out, problems, given)


def _move(s: Settings, where: str, msg: str, given: dict[str, str]) -> bool:
    """Move the default at `where` so the rule that refused it holds, when init chose it and one value settles it."""
    if where == "quantization.weights" and "--weights" not in given and s.weights == "none":
        s.weights = "fp8"
        s.why[where] = f"not none, which this engine refuses: {_first_sentence(msg)}"
        return True
    if where == "build.max_num_tokens" and s.num_tokens < s.input_len:
        s.num_tokens = s.input_len
        s.why[where] = f"raised to max_input_len: {_first_sentence(msg)}"
        return True
    return False


def refusal(out: Path, problems: list[tuple[str, str]], given: dict[str, str], header: str = "Recipe not written"):
    """A RecipeError naming the user's file, each refused field and the flag that set it (or the default that did)."""
    from trtkv.core.errors import RecipeError

    lines = []
    for where, msg in problems:
        flag = FLAGS.get(where)
        how = (f" (from {flag} {given[flag]})" if flag in given else
               f" (trtkv init's default; choose it with {flag})" if flag else "")
        lines.append(f"{out}: {where}{how}: {msg}. Next: change {flag or 'the flags'} and run trtkv init again")
    return RecipeError(lines, header=header)


def batch_for(fits: int, concurrency: int | None, on_cpu: bool) -> tuple[int, str]:
    """max_batch_size and why: --concurrency, else what fits at max_seq_len (at most MAX_BATCH); CPU_BATCH on the CPU."""
    if concurrency:
        return concurrency, f"--concurrency {concurrency} (sequences of max_seq_len fit: {fits})"
    if on_cpu:
        return CPU_BATCH, "a fixed batch on the CPU (capacity there is this host's RAM: `trtkv plan` shows it)"
    batch = max(1, min(fits, MAX_BATCH))
    return batch, (f"{fits} sequences of max_seq_len fit (trtkv plan)" + (f"; at most {MAX_BATCH} unless "
                                                                         f"--concurrency" if fits > MAX_BATCH else ""))


def _first_sentence(text: str) -> str:
    return text.split(". ")[0]


def _one_line(text: str) -> str:
    """Text safe inside a YAML comment: one line."""
    return " ".join(str(text).split())
