#!/bin/bash
# One task of trtkv deployment llama70b_fp8kv_attnhead_vllm (vllm); started by job.sbatch.
set -euo pipefail
[ -n "${TRTKV_API_KEY:-}" ] || { echo "trtkv: TRTKV_API_KEY is empty: the server would run without its API key" >&2; exit 1; }
export VLLM_API_KEY="$TRTKV_API_KEY"
exec python3 -m vllm.entrypoints.openai.api_server --model /models/llama70b_fp8kv_attnhead_vllm/checkpoint/hf --served-model-name llama70b_fp8kv_attnhead_vllm --host 0.0.0.0 --port 8000 --kv-cache-dtype fp8 --max-model-len 32768 --max-num-seqs 64 --max-num-batched-tokens 8192 --gpu-memory-utilization 0.92 --enable-chunked-prefill --enable-prefix-caching --tensor-parallel-size 4
