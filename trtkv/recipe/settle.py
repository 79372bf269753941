"""The check that the recipe text `trtkv init` renders (trtkv.checkpoints.render) validates for its
engine, in memory under the user's file name. A default the engine refuses is changed where one
field settles it (KV fp8 -> fp8_cast where the engine reads no KV scale beside a pre-quantized
checkpoint's weights, max_num_tokens raised to max_input_len for trtllm-build without paged context
FMHA), with a warning for a moved format; the weights are never moved (a pre-quantized checkpoint is
used as stored). Anything else is refused naming the user's file and the flag that set it. Also the
batch init sizes from what fits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trtkv.core.errors import RecipeError

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from trtkv.recipe.schema import Recipe

DEFAULT_NUM_TOKENS = 8192  # tokens per engine step (vLLM's max_num_batched_tokens)


@dataclass
class Settings:
    """The engine settings of one attempt: init changes weights/num_tokens/batch between attempts,
    never the flags."""

    gpu: str
    count: int
    kv: str
    weights: str
    backend: str
    seq_len: int
    batch: int
    num_tokens: int = DEFAULT_NUM_TOKENS
    # EP and attention-DP groups init proposes for an MoE model (trtkv.recipe.parallel)
    ep: int = 1
    attention_dp: int = 1
    # field -> why init moved it off its default (a comment)
    why: dict[str, str] = field(default_factory=dict)
    # the KV format the model's checkpoint declares and its folder (trtkv.recipe.stored)
    checkpoint_kv: tuple[str | None, str] = (None, "")

    @property
    def input_len(self) -> int:
        """Longest prompt: max_seq_len less an eighth kept for the answer."""
        return max(1, self.seq_len - max(1, self.seq_len // 8))

    @property
    def bench_input_tokens(self) -> int:
        """The workload init writes (bench.input_tokens): 2,048-token prompts on a GPU, 128 on the
        CPU, within max_input_len."""
        return min(128 if self.gpu == CPU else 2048, self.input_len)

    @property
    def bench_output_tokens(self) -> int:
        """bench.output_tokens: 256 on a GPU, 32 on the CPU, within max_seq_len."""
        return min(32 if self.gpu == CPU else 256, self.seq_len - self.bench_input_tokens)


# the CPU's capacity is the host's RAM, so a fixed batch keeps the recipe the same on every machine
CPU_BATCH = 16
CPU = "cpu"  # hardware.gpu's value for the CPU

# The init flag that sets each recipe field (a refusal names it); fields absent here are derived
# from these
FLAGS = {
    "quantization.weights": "--weights",
    "quantization.kv_cache": "--kv-cache",
    "build.backend": "--backend",
    "hardware.gpu": "--gpu",
    "hardware.count": "--count",
    "build.tp_size": "--count",
    "build.pp_size": "--count",
    "build.max_seq_len": "--max-seq-len",
    "build.max_input_len": "--max-seq-len",
    "build.max_batch_size": "--concurrency",
    "build.max_num_tokens": "--concurrency",
}


def check(name: str, out: Path, text: str) -> tuple[Recipe, list[tuple[str, str]]]:
    """The text validated as the recipe `out` (in memory: a schema error names the user's file), and
    the cross-field and engine rules it breaks."""
    from pydantic import ValidationError

    from trtkv.recipe.loader import validate_data
    from trtkv.recipe.plain_yaml import load_yaml
    from trtkv.recipe.rules import add_default_tasks, cross_field_problems
    from trtkv.recipe.schema import Recipe

    data = load_yaml(text)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError:
        validate_data(data, {}, out)  # raises the RecipeError naming `out`
        raise
    add_default_tasks(recipe)
    recipe._name = name
    recipe._path = out
    return recipe, cross_field_problems(recipe)


def settle(
    name: str, out: Path, s: Settings, given: dict[str, str], render: Callable[[Settings], str]
) -> tuple[str, Recipe]:
    """Render and check until the engine accepts the recipe, moving each default the rules refuse
    where that field alone settles it; otherwise a refusal of what is left (a moved field's problem
    as it was before the move)."""
    from trtkv.recipe.stored import declared_kv_problems

    before: dict[str, str] = {}  # field -> the problem that made init move it
    for _attempt in range(3):
        text = render(s)
        recipe, problems = check(name, out, text)
        problems += declared_kv_problems(recipe, *s.checkpoint_kv)
        if not problems:
            return text, recipe
        moved = [
            where for where, msg in problems if where not in before and _move(s, where, msg, given)
        ]
        before.update((where, msg) for where, msg in problems if where in moved)
        left = [(where, before.get(where, msg)) for where, msg in problems if where not in moved]
        if left or not moved:
            raise refusal(out, left or problems, given)
    raise refusal(out, problems, given)


# the formats init moves (a warning each, besides the recipe's comment)
MOVED_FORMATS = ("quantization.kv_cache",)


def _move(s: Settings, where: str, msg: str, given: dict[str, str]) -> bool:
    """Move the default at `where` so the rule that refused it holds, when init chose it and one
    value settles it: a calibrated FP8 KV cache to fp8_cast where the refusal offers it (the same
    cache at scale 1.0)."""
    if (
        where == "quantization.kv_cache"
        and "--kv-cache" not in given
        and s.kv == "fp8"
        and "kv_cache fp8_cast" in msg
    ):
        s.kv = "fp8_cast"
        s.why[where] = f"fp8_cast, not fp8: {_first_sentence(msg)}"
        return True
    if where == "build.max_num_tokens" and s.num_tokens < s.input_len:
        s.num_tokens = s.input_len
        s.why[where] = f"raised to max_input_len: {_first_sentence(msg)}"
        return True
    return False


def refusal(
    out: Path,
    problems: list[tuple[str, str]],
    given: dict[str, str],
    header: str = "Recipe not written",
) -> RecipeError:
    """A RecipeError naming the user's file, each refused field and the flag that set it (or the
    default that did)."""
    lines = []
    for where, msg in problems:
        flag = FLAGS.get(where)
        how = (
            f" (from {flag} {given[flag]})"
            if flag in given
            else f" (trtkv init's default; choose it with {flag})"
            if flag
            else ""
        )
        lines.append(
            f"{out}: {where}{how}: {msg}. Next: change {flag or 'the flags'} and run trtkv init "
            "again"
        )
    return RecipeError(lines, header=header)


def batch_for(
    fits: int,
    concurrency: int | None,
    on_cpu: bool,
    workload: tuple[int, int, int] | None = None,
    limit: tuple[int, str] | None = None,
) -> tuple[int, str]:
    """max_batch_size and why: --concurrency, else the sequences of the workload that fit (in
    tokens, out tokens, sequences: the engines admit by KV blocks, so a cap of `fits` full-context
    sequences would leave the pool idle under shorter traffic), at most the engine's own default
    (`limit`: sequences, its flag); CPU_BATCH on the CPU."""
    if concurrency:
        return concurrency, f"--concurrency {concurrency} (sequences of max_seq_len fit: {fits})"
    if on_cpu:
        return (
            CPU_BATCH,
            "a fixed batch on the CPU (capacity there is this host's RAM: `trtkv plan` shows it)",
        )
    if workload is None:
        return max(1, fits), f"{fits} sequences of max_seq_len fit (trtkv plan)"
    tokens_in, tokens_out, work = workload
    batch = max(1, min(work, limit[0]) if limit is not None else work)
    return batch, (
        f"{work} sequences of the bench workload ({tokens_in} in + {tokens_out} out tokens) fit, "
        f"{fits} of max_seq_len (trtkv plan)"
        + (
            f"; at most the engine's own {limit[1]} {limit[0]}"
            if limit is not None and work > limit[0]
            else ""
        )
    )


def _first_sentence(text: str) -> str:
    return text.split(". ")[0]


def propose_wide_ep(
    name: str,
    out: Path,
    s: Settings,
    given: dict[str, str],
    render: Callable[[Settings], str],
    recipe: Recipe,
    fits: int,
    fits_of: Callable[[Recipe], tuple[int, str]],
) -> int:
    """An MoE model: EP and attention DP over every TP rank where its engine runs them and they fit
    more sequences of max_seq_len (`fits_of`: the planner's count; kept in `s`); the sequences that
    fit either way."""
    from dataclasses import replace

    from trtkv.recipe.backend_rules import wide_ep

    proposal = wide_ep(recipe.build.backend, recipe.build.tp_size)
    if proposal is None:
        return fits
    wide = replace(s, ep=proposal[0], attention_dp=proposal[1], why=dict(s.why))
    try:
        _text, wide_recipe = settle(name, out, wide, given, render)
        wide_fits, _why = fits_of(wide_recipe)
    except RecipeError:  # the engine or the model refuses it: keep plain TP
        return fits
    if wide_fits <= fits:
        return fits
    s.ep, s.attention_dp = proposal
    s.why["build.ep_size"] = "experts spread over every GPU (MoE)"
    s.why["build.attention_dp_size"] = (
        f"each GPU attends to its own sequences: {wide_fits} of max_seq_len fit, {fits} under "
        "plain TP (trtkv plan)"
    )
    return wide_fits
