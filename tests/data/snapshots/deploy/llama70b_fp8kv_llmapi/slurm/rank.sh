#!/bin/bash
# One task of trtkv deployment llama70b_fp8kv_llmapi (trtllm-serve); started by job.sbatch.
set -euo pipefail
exec trtllm-llmapi-launch trtllm-serve /models/llama70b_fp8kv_llmapi/checkpoint/hf --backend pytorch --host 0.0.0.0 --port 8000 --tp_size 4 --pp_size 1 --max_batch_size 64 --max_num_tokens 8192 --max_seq_len 32768 --kv_cache_free_gpu_memory_fraction 0.9 --extra_llm_api_options /models/llama70b_fp8kv_llmapi/engine/llm_api_options.yaml
