#!/bin/bash
# One task of trtkv deployment llama70b_fp8kv_sglang (sglang); started by job.sbatch.
set -euo pipefail
[ -n "${TRTKV_API_KEY:-}" ] || { echo "trtkv: TRTKV_API_KEY is empty: the server would run without its API key" >&2; exit 1; }
exec python3 -m sglang.launch_server --model-path /models/llama70b_fp8kv_sglang/checkpoint/hf --served-model-name llama70b_fp8kv_sglang --host 0.0.0.0 --port 8000 --kv-cache-dtype fp8_e4m3 --context-length 32768 --max-running-requests 64 --chunked-prefill-size 8192 --enable-metrics --mem-fraction-static 0.828 --tp-size 4 --api-key "$TRTKV_API_KEY"
