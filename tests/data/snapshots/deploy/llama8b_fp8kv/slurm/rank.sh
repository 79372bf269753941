#!/bin/bash
# One task of trtkv deployment llama8b_fp8kv (triton); started by job.sbatch.
set -euo pipefail
[ -n "${TRTKV_API_KEY:-}" ] || { echo "trtkv: TRTKV_API_KEY is empty: the server would run without its API key" >&2; exit 1; }
if [ "$SLURM_PROCID" = 0 ]; then
    exec /opt/tritonserver/bin/tritonserver --http-restricted-api=shared-memory,model-repository,trace,logging:trtkv-api-key="$TRTKV_API_KEY" --grpc-restricted-protocol=shared-memory,model-repository,trace,logging:trtkv-api-key="$TRTKV_API_KEY" --model-repository=/models/llama8b_fp8kv/triton_repo --http-address=0.0.0.0 --http-port=8000 --grpc-address=0.0.0.0 --grpc-port=8001 --metrics-address=0.0.0.0 --metrics-port=8002 --disable-auto-complete-config --backend-config=python,shm-region-prefix-name=prefix0_
fi
exec /opt/tritonserver/bin/tritonserver --http-restricted-api=shared-memory,model-repository,trace,logging:trtkv-api-key="$TRTKV_API_KEY" --grpc-restricted-protocol=shared-memory,model-repository,trace,logging:trtkv-api-key="$TRTKV_API_KEY" --model-repository=/models/llama8b_fp8kv/triton_repo --http-address=0.0.0.0 --http-port=8000 --grpc-address=0.0.0.0 --grpc-port=8001 --metrics-address=0.0.0.0 --metrics-port=8002 --disable-auto-complete-config --backend-config=python,shm-region-prefix-name=prefix"$SLURM_PROCID"_ --model-control-mode=explicit --load-model=tensorrt_llm
