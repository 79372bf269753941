"""The tokenizer folders trtkv writes load in transformers 4.57.1 (TensorRT-LLM 1.x's pin: its Triton preprocessing
model, LLM API and trtllm-serve read them with it) exactly as in trtkv's transformers 5.x.

4.57.1, tokenizers 0.22.1 and huggingface_hub 0.36.0 live in .venv-tf457 (`make install-tf457`, a `make test`
prerequisite); the probe below runs there in a subprocess and here in-process, on the converted packaged models
(trtkv.checkpoints.models, the conversion's save) and on SmolLM2's saved again as calibrate saves tokenizer/ and hf/
(trtkv.checkpoints.tokenizer_files.save_tokenizer), over ~300 lines of calibration_data/ and a few edge cases: ids with
and without special tokens, decode with and without them, the named special tokens and ids, the chat template.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from trtkv.core import paths

TF457 = paths.project_root() / ".venv-tf457"
TF457_VERSION = "4.57.1"
MODELS = ("smollm2", "gemma3")
needs_tf457 = pytest.mark.skipif(not (TF457 / "transformers").is_dir(),
                                 reason=f"{TF457} is missing: `make install-tf457` (transformers {TF457_VERSION}, "
                                        f"TensorRT-LLM 1.x's pin; `make test` installs it)")


def probe(folders: list[str], texts: list[str]) -> dict[str, Any]:
    """What a transformers version makes of each tokenizer folder (runs under 4.57 too: plain transformers only)."""
    import transformers
    from transformers import AutoTokenizer

    out: dict[str, Any] = {"version": transformers.__version__}
    for folder in folders:
        try:
            tok = AutoTokenizer.from_pretrained(folder)
        except Exception as exc:  # noqa: BLE001 - the failure is the finding
            out[folder] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        names = ("bos_token", "eos_token", "unk_token", "pad_token")
        row: dict[str, Any] = {
            "special": {n: [getattr(tok, n), getattr(tok, n + "_id")] for n in names},
            "all_special_ids": sorted(tok.all_special_ids), "len": len(tok),
            "with": [], "without": [], "decode": [], "decode_skip": [],
        }
        for text in texts:
            ids = tok.encode(text, add_special_tokens=True)
            row["with"].append(ids)
            row["without"].append(tok.encode(text, add_special_tokens=False))
            row["decode"].append(tok.decode(ids))
            row["decode_skip"].append(tok.decode(ids, skip_special_tokens=True))
        if tok.chat_template:
            row["chat"] = tok.apply_chat_template([{"role": "user", "content": "Hello"}], tokenize=False,
                                                  add_generation_prompt=True)
        out[folder] = row
    return out


def start_probe_in_tf457(folders: list[str], texts: list[str], work: Path) -> subprocess.Popen[str]:
    """`probe` in a subprocess whose transformers is .venv-tf457's 4.57.1 (read with `finish_probe`)."""
    args = work / "probe_args.json"
    args.write_text(json.dumps({"folders": folders, "texts": texts}))
    code = textwrap.dedent(inspect.getsource(probe)) + (
        "\nimport json, sys\nfrom typing import Any\nargs = json.loads(open(sys.argv[1]).read())\n"
        "print('TRTKV_PROBE' + json.dumps(probe(args['folders'], args['texts'])))\n")
    env = {**os.environ, "PYTHONPATH": str(TF457), "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-c", "from __future__ import annotations\n" + code, str(args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish_probe(proc: subprocess.Popen[str]) -> dict[str, Any]:
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    return dict(json.loads(out.split("TRTKV_PROBE", 1)[1]))


def probe_in_tf457(folders: list[str], texts: list[str], work: Path) -> dict[str, Any]:
    return finish_probe(start_probe_in_tf457(folders, texts, work))


def probe_texts(limit: int = 300) -> list[str]:
    """Lines of calibration_data/ (both shipped files), plus whitespace, punctuation, non-ASCII and special-token text."""
    from trtkv.core.texts import CALIB_DEFAULT, load_texts

    lines = [line.strip()[:300] for record in load_texts(CALIB_DEFAULT) for line in record.split("\n") if line.strip()]
    step = max(1, len(lines) // limit)
    edge = ["", " ", "  two leading spaces", "a , b . c ! d ?", "tab\there\n\nnew paragraph", "caf\u00e9 \u6771\u4eac \U0001f600",
            "<|im_start|>user\nhi<|im_end|>", "<bos><start_of_turn>user\nhi<end_of_turn>", "<|endoftext|>x<eos>"]
    return edge + lines[::step][:limit]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each packaged model's converted folder, and SmolLM2's tokenizer saved again as calibrate saves tokenizer/ and
    hf/ (loaded by 5.x, saved through save_tokenizer; Gemma's takes the same path, at ~5 s a load)."""
    from transformers import AutoTokenizer

    from trtkv.checkpoints.models import packaged_model
    from trtkv.checkpoints.tokenizer_files import save_tokenizer

    out = {name: packaged_model(name) for name in MODELS}
    resaved = tmp_path_factory.mktemp("smollm2-tokenizer")
    save_tokenizer(AutoTokenizer.from_pretrained(str(out["smollm2"])), resaved)
    out["smollm2, saved as calibrate's tokenizer/"] = resaved
    return out


@pytest.mark.slow  # a side venv's transformers 4.57 and both packaged tokenizers loaded twice: ~18 CPU-s
@needs_tf457
def test_transformers_457_loads_trtkv_tokenizers_as_5x_does(folders: dict[str, Path], tmp_path: Path) -> None:
    texts = probe_texts()
    names = list(folders)
    paths_ = [str(folders[n]) for n in names]
    running = start_probe_in_tf457(paths_, texts, tmp_path)  # 4.57 in its own process while this one runs 5.x
    new = probe(paths_, texts)
    old = finish_probe(running)
    assert old.pop("version") == TF457_VERSION and new.pop("version").startswith("5.")
    for name, path in zip(names, paths_, strict=True):
        assert "error" not in old[path], f"{name}: transformers {TF457_VERSION} cannot load {path}: {old[path]['error']}"
        for key, value in new[path].items():
            assert old[path].get(key) == value, f"{name}: {key} differs between transformers {TF457_VERSION} and 5.x"
    for name in MODELS:  # the ids the model's own config (from the GGUF) states
        config = json.loads((folders[name] / "config.json").read_text())
        special = new[str(folders[name])]["special"]
        assert special["bos_token"][1] == config["bos_token_id"] and special["eos_token"][1] == config["eos_token_id"]
        adds_bos = new[str(folders[name])]["with"][3][:1] == [config["bos_token_id"]]
        tokenizer_config = json.loads((folders[name] / "tokenizer_config.json").read_text())
        assert tokenizer_config["add_bos_token"] is adds_bos and tokenizer_config["tokenizer_class"] == (
            "PreTrainedTokenizerFast")


def tiny_tokenizer(adds_bos: bool) -> Any:
    """A five-word tokenizer whose post-processor adds <s> (or nothing), as transformers 5.x holds it."""
    from tokenizers import Tokenizer, pre_tokenizers, processors
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    fast = Tokenizer(WordLevel({"<s>": 0, "</s>": 1, "<unk>": 2, "a": 3, "b": 4}, unk_token="<unk>"))
    fast.pre_tokenizer = pre_tokenizers.Whitespace()
    fast.post_processor = processors.TemplateProcessing(single="<s> $A" if adds_bos else "$A",
                                                        special_tokens=[("<s>", 0)] if adds_bos else [])
    return PreTrainedTokenizerFast(tokenizer_object=fast, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def test_the_saved_config_names_what_4x_reads(tmp_path: Path) -> None:
    """No 5.x-only class, no *_token_id keys or loader state; add_bos_token as tokenizer.json adds it; a special token
    the model states replaces the tokenizer's."""
    from trtkv.checkpoints.tokenizer_files import save_tokenizer

    save_tokenizer(tiny_tokenizer(adds_bos=True), tmp_path, special={"pad_token": "</s>"}, add_bos=True)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and config["add_bos_token"] is True
    assert not [k for k in config if k.endswith("_token_id") or k in ("is_local", "local_files_only")]
    assert json.loads((tmp_path / "special_tokens_map.json").read_text()) == {
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "</s>"}


def test_a_model_that_says_otherwise_than_its_tokenizer_json_is_refused(tmp_path: Path) -> None:
    from trtkv.checkpoints.tokenizer_files import save_tokenizer
    from trtkv.core.errors import StageError

    with pytest.raises(StageError, match="add_bos_token = True, but tokenizer.json's post-processor does not add"):
        save_tokenizer(tiny_tokenizer(adds_bos=False), tmp_path, add_bos=True)
