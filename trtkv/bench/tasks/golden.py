"""Golden outputs of the unquantized model, produced once and stored in
engines/<recipe>/golden.json.

Producer: plain transformers on the recipe's original weights (`resolve_model_dir`, float32 on CPU,
an ordinary unquantized DynamicCache), greedy. So the golden text is the unquantized model's:
agreement measures everything the deployed chain changes (weight and KV quantization, the runtime,
the server's tokenization and detokenization). The file is keyed by the model folder's config, the
prompts and max_tokens; a mismatch regenerates it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PRODUCER = (
    "transformers AutoModelForCausalLM, original weights in float32, unquantized KV "
    "(DynamicCache), greedy"
)


def golden_key(model_dir: Path, prompts: Sequence[str], max_tokens: int) -> str:
    config = (
        (model_dir / "config.json").read_bytes() if (model_dir / "config.json").is_file() else b""
    )
    blob = json.dumps(
        {
            "config": hashlib.sha256(config).hexdigest(),
            "prompts": list(prompts),
            "max_tokens": max_tokens,
            "producer": PRODUCER,
        },
        sort_keys=True,
    ).encode()
    return hashlib.sha256(blob).hexdigest()


def load_or_make(
    path: Path, model_dir: Path, prompts: Sequence[str], max_tokens: int, log: Any = print
) -> dict[str, Any]:
    """The stored golden outputs when their key matches, else generate them now (once) and store
    them."""
    key = golden_key(model_dir, prompts, max_tokens)
    if path.is_file():
        try:
            data: dict[str, Any] = json.loads(path.read_text())
            if data.get("key") == key:
                return data
        except json.JSONDecodeError:
            pass
    log(
        f"golden: generating reference outputs of the unquantized model ({len(prompts)} prompts, "
        "once) ..."
    )
    data = generate(model_dir, prompts, max_tokens)
    data["key"] = key
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)
    return data


def generate(model_dir: Path, prompts: Sequence[str], max_tokens: int) -> dict[str, Any]:
    """Greedy outputs (ids and text) of the unquantized model for each prompt."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.time()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, local_files_only=True
    ).eval()
    eos = model.generation_config.eos_token_id
    items = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=True)["input_ids"]
        with torch.inference_mode():
            out = model.generate(
                ids,
                max_new_tokens=max_tokens,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=tokenizer.pad_token_id or eos,
                attention_mask=torch.ones_like(ids),
            )
        new = [int(t) for t in out[0, ids.shape[1] :]]
        eos_ids = set(eos if isinstance(eos, list) else [eos])
        if new and new[-1] in eos_ids:
            new = new[:-1]
        items.append(
            {
                "prompt": prompt,
                "output_ids": new,
                "output_text": tokenizer.decode(
                    new, skip_special_tokens=True, clean_up_tokenization_spaces=False
                ),
            }
        )
    return {
        "model_dir": str(model_dir),
        "producer": PRODUCER,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "max_tokens": max_tokens,
        "seconds": round(time.time() - start, 1),
        "items": items,
    }


def agreement(tokenizer: Any, golden_ids: Sequence[int], served_text: str) -> float:
    """Fraction of the golden tokens reproduced: the longest k whose decoded golden prefix starts
    the served text."""
    if not golden_ids:
        return 1.0 if not served_text else 0.0
    best = 0
    for k in range(1, len(golden_ids) + 1):
        prefix = tokenizer.decode(
            list(golden_ids[:k]), skip_special_tokens=True, clean_up_tokenization_spaces=False
        )
        # no early exit: a prefix ending inside a UTF-8 character never matches
        if served_text.startswith(prefix):
            best = k
    return best / len(golden_ids)
