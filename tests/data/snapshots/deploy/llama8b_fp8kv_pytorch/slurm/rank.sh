#!/bin/bash
# One task of trtkv deployment llama8b_fp8kv_pytorch (trtllm-serve); started by job.sbatch.
set -euo pipefail
exec trtllm-llmapi-launch trtllm-serve /models/llama8b_fp8kv_pytorch/checkpoint/hf --backend pytorch --host 0.0.0.0 --port 8000 --tp_size 1 --pp_size 1 --max_batch_size 128 --max_num_tokens 16384 --max_seq_len 65536 --kv_cache_free_gpu_memory_fraction 0.9 --extra_llm_api_options /models/llama8b_fp8kv_pytorch/engine/llm_api_options.yaml
