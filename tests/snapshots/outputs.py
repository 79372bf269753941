"""The generated files users keep, produced the way a user produces them (the `trtkv` CLI, in process) and normalised
only where the value belongs to the machine, not to trtkv:

- paths: the snapshot's scratch folder (engines/, triton_repo/, deploy output, the copied model configs) becomes
  `<TMP>`, the checkout `<PROJECT>`, the Python install `<SITE_PACKAGES>`, `<VENV>`, `<PYTHON_LIBDIR>`,
  `<PYTHON_HOME>`. The scratch folder is `/tmp/trtkv-snap-XXXXXXXX` on every machine, so YAML that wraps long lines
  at a fixed width wraps at the same places wherever it runs;
- host RAM: a CPU recipe's capacity follows this machine's memory; the snapshots fix it at HOST_RAM_GIB;
- a stage manifest's run record (`finished_at`, `wall_seconds`, `tool_versions`): time and installed packages; in its
  `files` list each file's `mtime_ns` and `sha256` (the time it was written, and a digest over bytes that hold the
  scratch path: the files themselves are snapshotted byte for byte, their names stay), and the `bytes` of a file that
  holds a machine path (a README's commands name the checkout: its size follows where the clone lies).

Nothing else is touched: every other byte is what trtkv wrote. The trtkv cache is an empty folder (no converted model:
the packaged recipes plan from their own fields), and the CPU repositories copy SmolLM2's real tokenizer from where
`trtkv calibrate` puts it (engines/<recipe>/checkpoint/tokenizer).
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import stat
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
CONFIGS = PROJECT / "tests" / "data" / "configs"
TEMPLATES = PROJECT / "trtkv" / "repo" / "templates"
HOST_RAM_GIB = 32.0
VOLATILE_KEYS = ("finished_at", "started_at", "wall_seconds", "tool_versions")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                   "chat_template.jinja")

# `trtkv init NAME --model tests/data/configs/<config> [options]`: every config family with the defaults, and the
# options users pass (a GPU and count, the CPU, another engine, another KV format)
INIT_CASES: dict[str, tuple[str, tuple[str, ...]]] = {
    **{name: (name, ()) for name in sorted(p.name for p in CONFIGS.iterdir() if (p / "config.json").is_file())},
    "deepseek_v3-h200x8": ("deepseek_v3", ("--gpu", "H200-141GB", "--count", "8")),
    "llama3_1_8b-cpu": ("llama3_1_8b", ("--gpu", "cpu")),
    "gemma3_27b-cpu": ("gemma3_27b", ("--gpu", "cpu")),
    "gemma3_27b-vllm": ("gemma3_27b", ("--backend", "vllm")),
    "qwen3_30b_a3b-b200-nvfp4": ("qwen3_30b_a3b", ("--gpu", "B200", "--kv-cache", "nvfp4")),
    "llama3_1_8b-sglang": ("llama3_1_8b", ("--backend", "sglang")),
}

# `trtkv deploy` beyond each GPU recipe's defaults: several nodes (a LeaderWorkerSet, a multi-node Slurm job) and
# replicas sized from a target concurrency
DEPLOY_EXTRA: dict[str, tuple[str, tuple[str, ...]]] = {
    "llama70b_fp8kv-tp8pp2": ("llama70b_fp8kv", ("build.tp_size=8", "build.pp_size=2", "hardware.count=16")),
    "llama70b_fp8kv_llmapi-concurrency256": ("llama70b_fp8kv_llmapi", ("--target-concurrency", "256")),
}
TARGETS = ("k8s", "slurm", "dynamo")


@dataclass
class Scratch:
    """The scratch folder and the (real path, placeholder) pairs, longest path first."""

    root: Path
    pairs: list[tuple[str, str]] = field(default_factory=list)
    repos: set[str] = field(default_factory=set)  # recipes whose repository is written in this scratch

    def normalise(self, text: str) -> str:
        for real, placeholder in self.pairs:
            text = text.replace(real, placeholder)
        return text



def joined_notes(text: str) -> str:
    """The plan's notes each on one line: the plan wraps them at 100 columns, and a note that names the recipe's file
    holds the checkout's path, whose length follows where the clone lies (a snapshot must not)."""
    out: list[str] = []
    for line in text.splitlines():
        if out and out[-1].startswith("Note: ") and line.startswith("  ") and not line.startswith("   "):
            out[-1] += " " + line.strip()
        else:
            out.append(line)
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")

def _path_pairs(root: Path) -> list[tuple[str, str]]:
    named = {
        "<TMP>": [root],
        "<PROJECT>": [PROJECT],
        "<SITE_PACKAGES>": [Path(sysconfig.get_paths()["purelib"])],
        "<VENV>": [Path(sys.prefix)],
        "<PYTHON_LIBDIR>": [Path(str(sysconfig.get_config_var("LIBDIR") or sys.base_prefix))],
        "<PYTHON_HOME>": [Path(sys.base_prefix)],
    }
    pairs = {}
    for placeholder, paths in named.items():
        for path in paths:
            for variant in (str(path), str(path.resolve())):
                if len(variant) > 1:
                    pairs.setdefault(variant, placeholder)
    return sorted(pairs.items(), key=lambda kv: -len(kv[0]))


@contextlib.contextmanager
def scratch(smollm2_dir: Path) -> Iterator[Scratch]:
    """A fixed-length scratch folder with engines/, triton_repo/, an empty cache and the model configs; the trtkv
    environment pointed at it and host RAM fixed, for the time of the block."""
    import pytest

    from trtkv.engines import vllm_cpu
    from trtkv.plan import planner
    from trtkv.platform import host

    root = Path(tempfile.mkdtemp(prefix="trtkv-snap-", dir="/tmp"))
    try:
        shutil.copytree(CONFIGS, root / "configs")
        for name in ("smollm2_fp8kv", "smollm2_fp16kv", "smollm2_int8kv", "smollm2_fp8kv_llmapi"):
            tokenizer = root / "engines" / name / "checkpoint" / "tokenizer"
            tokenizer.mkdir(parents=True)
            for file in TOKENIZER_FILES:
                if (smollm2_dir / file).is_file():
                    shutil.copy2(smollm2_dir / file, tokenizer / file)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("TRTKV_ENGINES", str(root / "engines"))
            mp.setenv("TRTKV_TRITON_REPO", str(root / "triton_repo"))
            mp.setenv("TRTKV_CACHE", str(root / "cache"))
            mp.delenv("TRTKV_HOME", raising=False)
            mp.setattr(planner, "host_memory_gib", lambda: HOST_RAM_GIB)
            # vLLM CPU's pool reads the memory node's MemTotal (vllm_cpu): the same fixed host, or the plans of
            # vllm recipes follow the machine the tests run on
            mp.setattr(vllm_cpu, "memory_node_total_bytes", lambda node=0: HOST_RAM_GIB * 2**30)
            # vllm-cpu's Gated DeltaNet state dtype follows the CPU (AVX-512 BF16: float32): the writing machine's
            mp.setattr(host, "cpu_avx512_bf16", lambda: True)
            yield Scratch(root, _path_pairs(root))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_cli(*argv: str) -> tuple[int, str, str]:
    """`trtkv ARGV` in this process: (exit code, stdout, stderr)."""
    from trtkv.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _cli_ok(*argv: str) -> str:
    code, out, err = run_cli(*argv)
    if code != 0:
        raise RuntimeError(f"trtkv {' '.join(argv)} exited {code}:\n{err}")
    return out


def _normalise_manifest(text: str, holds_paths: set[str] = frozenset()) -> str:
    """`holds_paths`: the files (relative to the manifest's folder) whose bytes hold a machine path, so whose size
    follows the machine (the checkout's path in a README's commands) and is normalised with them."""
    data = json.loads(text)
    for key in VOLATILE_KEYS:
        if key in data:
            data[key] = "<varies>" if not isinstance(data[key], dict) else {k: "<varies>" for k in data[key]}
    for name, entry in (data.get("files") or {}).items():
        for key in ("mtime_ns", "sha256"):
            if key in entry:
                entry[key] = "<varies>"
        if name in holds_paths and "bytes" in entry:
            entry["bytes"] = "<varies: holds machine paths>"
    return json.dumps(data, indent=2) + "\n"


def _template_of(path: Path) -> str | None:
    """The template file `path` is a byte-for-byte copy of, if any."""
    data = path.read_bytes()
    for template in sorted(TEMPLATES.rglob("*")):
        if template.is_file() and "__pycache__" not in template.parts and template.read_bytes() == data:
            return str(template.relative_to(PROJECT))
    return None


def read_folder(folder: Path, s: Scratch) -> dict[str, str]:
    """Every file trtkv wrote under `folder`, normalised; `_files.txt` lists them all with their mode, and says which
    were copied (the tokenizer, files identical to a template) and so are listed but not kept here."""
    files: dict[str, str] = {}
    index = []
    manifests: list[Path] = []
    raw: dict[str, str] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = str(path.relative_to(folder))
        mode = "executable" if path.stat().st_mode & stat.S_IXUSR else "file"
        template = _template_of(path)
        if "tokenizer" in path.parent.parts[len(folder.parts):]:
            index.append(f"{rel}  {mode}  copied: the model's tokenizer")
        elif template is not None:
            index.append(f"{rel}  {mode}  copied: {template}")
        else:
            raw[rel] = path.read_text(encoding="utf-8")
            files[rel] = s.normalise(raw[rel])
            if path.name == "manifest.json":
                manifests.append(path)
            index.append(f"{rel}  {mode}")
    holds_paths = {rel for rel in files if files[rel] != raw[rel]}
    for path in manifests:
        rel = str(path.relative_to(folder))
        base = path.parent.relative_to(folder)
        beside = {str(Path(r).relative_to(base)) for r in holds_paths if Path(r).is_relative_to(base)}
        files[rel] = _normalise_manifest(files[rel], beside)
    files["_files.txt"] = "\n".join(index) + "\n"
    return files


def plan_outputs(recipe: str, s: Scratch) -> dict[str, str]:
    """`trtkv plan RECIPE --json` and the text `trtkv plan RECIPE --full` prints (the one-screen answer `trtkv plan`
    prints, then everything under it)."""
    return {"plan.json": s.normalise(_cli_ok("plan", recipe, "--json")),
            "plan.txt": joined_notes(s.normalise(_cli_ok("plan", recipe, "--full")))}


def init_outputs(case: str, s: Scratch) -> dict[str, str]:
    """The recipe `trtkv init` writes for the case, and `trtkv plan --json` of it (the planner reading config.json)."""
    config, options = INIT_CASES[case]
    name = case.replace("-", "_")
    out = s.root / "init" / f"{name}.yaml"
    _cli_ok("init", name, "--model", str(s.root / "configs" / config), "--output", str(out), *options)
    return {"recipe.yaml": s.normalise(out.read_text(encoding="utf-8")),
            "plan.json": s.normalise(_cli_ok("plan", str(out), "--json"))}


def repo_outputs(recipe: str, s: Scratch) -> dict[str, str]:
    """triton_repo/<recipe>/ as `trtkv repo RECIPE` writes it."""
    _cli_ok("repo", recipe, "--force")
    s.repos.add(recipe)
    return read_folder(s.root / "triton_repo" / recipe, s)


def _with_repo(recipe: str, s: Scratch) -> None:
    """A deploy's load id follows the artifacts' manifests: the recipe's repository (when it has one) is written
    first, as `trtkv repo` leaves it, whichever snapshot runs first (a `-k deploy` run, another order, xdist)."""
    from trtkv.backends import for_recipe
    from trtkv.recipe import load_recipe

    if recipe not in s.repos and for_recipe(load_recipe(recipe)).repo is not None:
        _cli_ok("repo", recipe, "--force")
        s.repos.add(recipe)


def deploy_outputs(case: str, target: str, s: Scratch) -> dict[str, str]:
    """`trtkv deploy RECIPE --target T [options]`'s folder, or, where trtkv refuses the pair, its message."""
    recipe, options = DEPLOY_EXTRA.get(case, (case, ()))
    _with_repo(recipe, s)
    out = s.root / "deploy" / case / target
    if target != "slurm":  # the Kubernetes targets' loader Job copies from the source the user names
        options = (*options, "--model-source", f"s3://my-bucket/trtkv/{recipe}")
    code, _, err = run_cli("deploy", recipe, "--target", target, "--output", str(out), *options)
    if code != 0:
        return {"refused.txt": s.normalise(err)}
    return read_folder(out, s)


def write_snapshot(folder: Path, files: dict[str, str]) -> None:
    """Replace the snapshot folder's files with `files` (files no longer produced are removed)."""
    if folder.exists():
        shutil.rmtree(folder)
    for rel, text in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def read_snapshot(folder: Path) -> dict[str, str]:
    if not folder.is_dir():
        return {}
    return {str(p.relative_to(folder)): p.read_text(encoding="utf-8") for p in sorted(folder.rglob("*")) if p.is_file()}

