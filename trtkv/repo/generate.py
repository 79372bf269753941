"""`trtkv repo`: write triton_repo/<recipe>/ (the TensorRT-LLM backend's inflight_batcher_llm
layout).

Models: preprocessing (tokenizer), tensorrt_llm (per build backend: `tensorrtllm` engine, LLM-API
Python model, or trtkv's reference runtime), postprocessing (detokenizer) and ensemble. Every value
comes from the recipe; the files come from trtkv/repo/templates/. The repository is written to a
temporary folder, validated with Triton's own protobuf schema (trtkv.repo.validate), and only then
renamed into place (trtkv.contracts.stage.run_stage).
"""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from string import Template
from typing import Any

from trtkv.backends import RepoLayout, TokenizerSource, for_recipe
from trtkv.checkpoints import models as model
from trtkv.contracts.stage import StageResult, manifest_hash, require_input, run_stage
from trtkv.core.errors import StageError
from trtkv.engines.kv_tiers import engine_tier_params
from trtkv.engines.trtllm import ENGINE_CAP_PARAM, ENGINE_FRACTION_PARAM
from trtkv.recipe import Recipe, host_tier_bytes, layout
from trtkv.recipe.prefix_cache import prefix_cache
from trtkv.repo.repo_plan import RepoPlan
from trtkv.repo.validate import check_model_yaml, validate_repo

TEMPLATES = Path(__file__).resolve().parent / "templates"
SECTIONS = ("model", "quantization", "build", "hardware", "triton")
MAX_BEAM_WIDTH = 1  # trtkv builds engines with the trtllm-build default of one beam
SHARED_MODULE = "common/trtkv_model_utils.py"  # copied next to every Python model.py
# inside a model folder: Triton would take a top-level folder for a model
TOKENIZER_IN_REPO = "preprocessing/tokenizer"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "generation_config.json",
)
# upstream's tensorrt_llm tensors, shared by every backend's tensorrt_llm model
LLM_IO = "tensorrt_llm/io.pbtxt"
# upstream's llmapi model.py reads its triton_config from it
MODEL_YAML = "tensorrt_llm/1/model.yaml"


def _has_tokenizer(folder: Path) -> bool:
    return (folder / "tokenizer_config.json").is_file() or (folder / "tokenizer.json").is_file()


def _local_model_dir(recipe: Recipe) -> Path | None:
    """The model's HF folder with a tokenizer when it is already on disk (never converts or
    downloads)."""
    folder = model.local_model_dir(recipe)
    return folder if folder is not None and _has_tokenizer(folder) else None


def plan_repo(recipe: Recipe) -> RepoPlan:
    """Resolve paths; the CPU recipe copies its tokenizer in, GPU recipes reference it (warning when
    absent)."""
    engine, checkpoint = layout.engine_dir(recipe), layout.checkpoint_dir(recipe)
    # the configs name the paths the server sees (a container: /models/...)
    at = layout.served_artifacts(recipe)
    plan = RepoPlan(recipe, layout.repo_dir(recipe), engine, checkpoint, None, "", at)
    calibrated = layout.checkpoint_tokenizer_dir(recipe)
    repo = _layout(recipe)
    needed, stage = repo.input(recipe)
    # the engine loads the tokenizer of the checkpoint it serves
    if repo.tokenizer is TokenizerSource.SERVED_MODEL:
        plan.tokenizer_ref = str(layout.served_path(recipe, needed))
    elif repo.tokenizer is TokenizerSource.COPY:
        source = calibrated if _has_tokenizer(calibrated) else _local_model_dir(recipe)
        if source is None:
            raise StageError(
                f"repo {recipe.name}: no tokenizer to copy: {calibrated} does not exist and the "
                f"model ({recipe.model.source}) is not on this machine. Next: `trtkv calibrate "
                f"{recipe.name}`."
            )
        plan.tokenizer_source, plan.tokenizer_ref = source, TOKENIZER_IN_REPO
    else:
        plan.tokenizer_ref = str(at.tokenizer)
        if not _has_tokenizer(calibrated):
            plan.warnings.append(
                f"tokenizer {calibrated} does not exist yet (written by `trtkv calibrate "
                f"{recipe.name}`); the repository references it"
            )
    if not (needed / "manifest.json").is_file() and not (needed / "config.json").is_file():
        plan.warnings.append(
            f"{needed} does not exist yet (written by `trtkv {stage} {recipe.name}`); "
            f"the repository references it"
        )
    # it exists: it must be this recipe's (model, weights, KV format)
    elif (needed / "manifest.json").is_file():
        require_input(needed, "repo", stage, recipe)
    return plan


def _layout(recipe: Recipe) -> RepoLayout:
    """The recipe's repository layout; StageError for a backend without one."""
    repo = for_recipe(recipe).repo
    if repo is None:
        raise StageError(
            f"repo {recipe.name}: backend {recipe.build.backend.value} has no Triton repository: "
            f"{_server_name(recipe)} serves the HF export itself. Next: `trtkv serve "
            f"{recipe.name}` (after `trtkv build {recipe.name}`)."
        )
    return repo


def _server_name(recipe: Recipe) -> str:
    server = for_recipe(recipe).serving.openai
    return server.label if server is not None else "its own server"


def pbtxt_string(text: str) -> str:
    """`text` escaped for a protobuf text-format "..." literal, so Triton reads back exactly `text`
    (a `"` or a newline in a path never ends the string or adds a field)."""
    out = []
    for ch in text:
        if ch in "\\\"'":
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\{ord(ch):03o}")
        else:
            out.append(ch)
    return "".join(out)


def comment_text(text: str) -> str:
    """`text` for a `#` comment line: anything unprintable (a newline would start a new field)
    becomes `?`."""
    return "".join(ch if ch.isprintable() else "?" for ch in text)


# values that land inside "..." string literals of the templates (paths carry the recipe name)
STRING_VALUES = (
    "tokenizer_dir",
    "engine_dir",
    "hf_model_dir",
    "extra_llm_api_options",
    "llm_module",
    "llm_step_model",
)


def template_values(plan: RepoPlan) -> dict[str, str]:
    """Every ${name} the templates use, from the recipe; strings escaped for where they land
    (defence in depth behind the recipe-name rule)."""
    values = _raw_values(plan)
    for name in STRING_VALUES:
        values[name] = pbtxt_string(values[name])
    values["recipe_name"] = comment_text(values["recipe_name"])
    return values


def _raw_values(plan: RepoPlan) -> dict[str, str]:
    r = plan.recipe
    t, b = r.triton, r.build
    flag = lambda value: "true" if value else "false"  # noqa: E731
    # fp8 | int8 | auto (the model dtype)
    kv_dtype = (layout.kv_cache_quant_algo(r) or "auto").lower()
    tier = engine_tier_params(r)
    return {
        "recipe_name": r.name,
        "triton_max_batch_size": str(b.max_batch_size),
        "max_queue_delay_microseconds": str(t.max_queue_delay_microseconds),
        "decoupled": flag(t.decoupled),
        "instance_count": str(t.instance_count),
        "pre_post_instance_count": str(t.instance_count),
        "threads_per_instance": "auto",
        "tokenizer_dir": plan.tokenizer_ref,
        "add_special_tokens": "true",
        "skip_special_tokens": "true",
        "max_input_len": str(b.max_input_len),
        "max_seq_len": str(b.max_seq_len),
        "max_num_tokens": str(b.max_num_tokens),
        "engine_dir": str(plan.at.engine),
        "hf_model_dir": str(plan.at.hf),
        "extra_llm_api_options": str(plan.at.engine / "extra_llm_api_options.yaml"),
        "kv_cache_dtype": kv_dtype,
        "batching_strategy": t.batching_strategy.value,
        "batch_scheduler_policy": t.batch_scheduler_policy.value,
        **_memory_values(r),
        **tier,  # the host KV tier: kv_cache_host_memory_bytes per rank, kv_cache_onboard_blocks
        # explicit: the engine's default where it may reuse
        "enable_kv_cache_reuse": flag(prefix_cache(r).enabled),
        # the reference runtime's second pool, else the engine's bytes per rank, else none (0)
        "kv_cache_host_memory_bytes": str(
            host_tier_bytes(r) or tier["kv_cache_host_memory_bytes"] or 0
        ),
        "enable_chunked_context": flag(r.chunked_context),
        "exclude_input_in_output": flag(t.exclude_input_in_output),
        "max_beam_width": str(MAX_BEAM_WIDTH),
        "tp_size": str(b.tp_size),
        "pp_size": str(b.pp_size),
        "tensorrt_llm_io": llm_io(python=False),
        "tensorrt_llm_io_python": llm_io(python=True),
        **_layout(r).template_values(r),  # llm_step_model, llm_module
        "postprocessing_instance_count": "1" if t.decoupled else str(t.instance_count),
        "vocab_size": str(model_vocab_size(plan) or ""),
    }


def _memory_values(r: Recipe) -> dict[str, str]:
    """The KV-cache memory parameters the plan sized the pool with (the backend's MemoryRule): the
    free-memory fraction (TensorRT-LLM's default resolved) and max_tokens_in_paged_kv_cache when
    triton.kv_pool_gib_per_gpu caps."""
    rule = for_recipe(r).memory
    knobs = rule.knobs(r) if rule is not None else None
    value = knobs.value if knobs is not None else None
    cap = knobs.cap_value if knobs is not None else None
    return {
        ENGINE_FRACTION_PARAM: "" if value is None else f"{value:g}",
        ENGINE_CAP_PARAM: "" if cap is None else str(cap),
    }


def model_vocab_size(plan: RepoPlan) -> int | None:
    """The model's vocabulary: the checkpoint's config.json (what the engine has), else the recipe's
    model.vocab_size."""
    import json

    config = plan.checkpoint_dir / "config.json"
    if config.is_file():
        try:
            return int(json.loads(config.read_text())["vocab_size"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return plan.recipe.model.vocab_size


def llm_io(*, python: bool) -> str:
    """Upstream's tensorrt_llm tensors. Python models get them without `reshape` (a BLS model
    forwards the tensors it receives to the C++ model, which needs the [batch, 1] shape the ensemble
    sends)."""
    text = (TEMPLATES / LLM_IO).read_text(encoding="utf-8").rstrip("\n")
    return text.replace(" reshape: { shape: [ ] }", "") if python else text


def render(template: str, values: dict[str, str]) -> str:
    """Fill ${name}s; unknown names stay (validation then reports file, line and name)."""
    return Template((TEMPLATES / template).read_text(encoding="utf-8")).safe_substitute(values)


def templates_digest() -> str:
    """sha256 over every template file (a template change makes the repository stale)."""
    digest = hashlib.sha256()
    for path in sorted(TEMPLATES.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(TEMPLATES)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


TRTKV_MODULE = re.compile(r"\btrtkv(?:\.[a-z_][a-z0-9_]*)+")


def named_modules(plan: RepoPlan) -> dict[str, str]:
    """Every trtkv module the repository names (in its templates, or as the `llm_module` parameter),
    with the file it resolves to now: a module that moves, or is gone, changes the repo stage's key,
    so a repository written before the move is rebuilt instead of reported up to date and broken."""
    import importlib.util

    text = "\n".join(
        p.read_text(errors="replace")
        for p in sorted(TEMPLATES.rglob("*"))
        if p.is_file() and p.suffix in (".py", ".pbtxt")
    )
    names = set(TRTKV_MODULE.findall(text + "\n" + template_values(plan)["llm_module"]))
    out: dict[str, str] = {}
    for name in sorted(names):
        try:
            spec = importlib.util.find_spec(name)
        except ModuleNotFoundError:  # a parent package that does not exist
            spec = None
        origin = Path(spec.origin) if spec and spec.origin else None
        out[name] = (
            str(origin.relative_to(TEMPLATES.parents[1]))
            if origin and origin.is_relative_to(TEMPLATES.parents[1])
            else ("missing" if origin is None else str(origin))
        )
    return out


def write_models(plan: RepoPlan, target: Path) -> list[str]:
    """Render every model folder into `target`; returns the model names."""
    values = template_values(plan)
    repo = _layout(plan.recipe)
    models = repo.models()
    for name, (config, script) in models.items():
        version = target / name / "1"
        version.mkdir(parents=True)
        (target / name / "config.pbtxt").write_text(render(config, values), encoding="utf-8")
        if script is not None:
            shutil.copyfile(TEMPLATES / script, version / "model.py")
            if repo.shared_module:
                shutil.copyfile(TEMPLATES / SHARED_MODULE, version / Path(SHARED_MODULE).name)
    for relative, text in repo.files(plan.recipe).items():
        (target / relative).write_text(text, encoding="utf-8")
    return sorted(models)


def copy_tokenizer(source: Path, target: Path) -> list[str]:
    target.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, target / name)
            copied.append(name)
    return copied


def generate_into(plan: RepoPlan, target: Path) -> dict[str, Any]:
    """Write, copy and validate the whole repository in `target`; returns manifest fields."""
    from trtkv.repo.readme import readme_text

    models = write_models(plan, target)
    copied: list[str] = []
    if plan.tokenizer_source is not None:
        copied = copy_tokenizer(plan.tokenizer_source, target / TOKENIZER_IN_REPO)
    (target / "README.md").write_text(readme_text(plan), encoding="utf-8")
    validate_repo(target, expect_decoupled=plan.recipe.triton.decoupled)
    if MODEL_YAML in _layout(plan.recipe).files(plan.recipe):
        # upstream's model.py reads its triton_config
        check_model_yaml(target, plan.recipe.triton.decoupled)
    return {
        "models": models,
        "backend": plan.recipe.build.backend.value,
        "engine_dir": str(plan.engine_dir),
        "served_paths": {
            "engine": str(plan.at.engine),
            "checkpoint": str(plan.at.checkpoint),
            "repository": str(plan.at.repo),
        },
        "tokenizer_dir": plan.tokenizer_ref,
        "tokenizer_copied_from": str(plan.tokenizer_source or ""),
        "tokenizer_files": copied,
        "warnings": plan.warnings,
        "validated": True,
    }


def generate_repo(
    recipe: Recipe, *, force: bool = False, log: Callable[[str], None] = print
) -> StageResult:
    """The repo stage: plan, warn about what is missing, write atomically, validate before the
    rename."""
    plan = plan_repo(recipe)
    for warning in plan.warnings:
        log(f"repo: warning: {warning}")
    engine_hash = manifest_hash(plan.engine_dir)
    key = {
        "templates": templates_digest(),
        "tokenizer": str(plan.tokenizer_source or plan.tokenizer_ref),
        "engine_manifest": engine_hash,
        "trtkv_modules": named_modules(plan),
    }
    return run_stage(
        "repo",
        recipe,
        plan.output,
        lambda tmp: generate_into(plan, tmp),
        sections=SECTIONS,
        input_hash=engine_hash,
        force=force,
        extra_key=key,
        log=log,
    )
