"""QuantizedKVCache on the real SmolLM2-135M: fp16 generation equals plain transformers, bytes match the formula."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trtkv.kvcache.cache import QuantizedKVCache
from trtkv.kvcache.formats import kv_bytes_per_token

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2(smollm2_dir: Path):  # noqa: ANN201
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(smollm2_dir))


@pytest.mark.e2e  # runs the real model: not in `make check`
def test_fp16_cache_generation_equals_plain_transformers(smollm2) -> None:  # noqa: ANN001
    model, tok = smollm2
    for prompt in ("The capital of France is", "In the beginning God created"):
        ids = tok(prompt, return_tensors="pt").input_ids
        plain = model.generate(ids, max_new_tokens=24, do_sample=False)
        cache = QuantizedKVCache(model.config, "fp16")
        mine = model.generate(ids, max_new_tokens=24, do_sample=False, past_key_values=cache)
        assert mine.tolist() == plain.tolist()
        assert cache.get_seq_length() == plain.shape[1] - 1


@pytest.mark.parametrize("fmt", ["fp8", "int8", "int8_token", "int4_g64", "kivi2"])
def test_real_model_bytes_per_token_match_formula(smollm2, fmt: str) -> None:  # noqa: ANN001
    model, _ = smollm2
    cfg = model.config
    scales = [0.05] * cfg.num_hidden_layers if fmt in ("fp8", "int8") else None
    cache = QuantizedKVCache(cfg, fmt, scales, scales)
    ids = torch.randint(100, 40000, (1, 256), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        model.model(input_ids=ids, past_key_values=cache, use_cache=True)
    formula = kv_bytes_per_token(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, fmt)
    assert cache.stored_bytes() / 256 == pytest.approx(formula, rel=0.01)
