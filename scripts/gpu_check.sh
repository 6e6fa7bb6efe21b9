#!/usr/bin/env bash
# The GPU path checked on one GPU in under 8 minutes (scripts/gpu_check.py): the embedded engine on CUDA
# in bfloat16, one update of the trainer's log-prob pass on the model (4 messages x 1,024 tokens, forward,
# backward and an AdamW step, without and with body checkpointing; peak CUDA memory), a CUDA vLLM server
# with two role LoRAs and hot-swaps, one TeamTR stage with rollouts through vLLM; prints what it measured
# as JSON (also written to build/gpu_check.json).
#
#   bash scripts/gpu_check.sh                   # on a GPU machine (installs the CUDA vLLM first)
#   bash scripts/gpu_check.sh --device cpu      # the dry run on this CPU machine (vLLM CPU if installed)
#   TEAMTR_GPU_CHECK_MODEL=smollm2 bash scripts/gpu_check.sh   # another base model (default: the demo's)
#   TEAMTR_GPU_CHECK_MODEL=Qwen/Qwen3-8B bash scripts/gpu_check.sh --update-only   # the 8B update alone
#
# .venv's torch must see the GPU (`make install TORCH_SPEC="torch==2.13.0 --index-url
# https://download.pytorch.org/whl/cu128"` on a GPU machine); the script says so before anything runs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
BUDGET_S=${TEAMTR_GPU_CHECK_BUDGET_S:-480}
DEVICE=cuda
UPDATE_ONLY=0
for ((i = 1; i <= $#; i++)); do
    if [ "${!i}" = "--device" ]; then j=$((i + 1)); DEVICE=${!j}; fi
    if [ "${!i}" = "--update-only" ]; then UPDATE_ONLY=1; fi
done
if [[ "$DEVICE" == cuda* ]]; then
    "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" || {
        echo "gpu_check: $("$PY" -c 'import torch; print("torch", torch.__version__)') in $PY sees no GPU;" \
            "install a CUDA torch (see the top of this script) or run with --device cpu" >&2
        exit 2
    }
    # the CUDA build of vLLM in its own venv (idempotent; a CPU .vllm-venv is replaced); not for the update alone
    if [ "$UPDATE_ONLY" = 0 ]; then TEAMTR_VLLM_SPEC=${TEAMTR_VLLM_SPEC:-vllm} bash scripts/setup_vllm.sh; fi
fi
MODEL_ARGS=()
if [ -n "${TEAMTR_GPU_CHECK_MODEL:-}" ]; then MODEL_ARGS=(--model "$TEAMTR_GPU_CHECK_MODEL"); fi
mkdir -p build
# the device check as a whole stays within the budget (vLLM's start-up is most of it)
exec timeout --kill-after=20 "$BUDGET_S" "$PY" scripts/gpu_check.py "${MODEL_ARGS[@]}" --out build/gpu_check.json "$@"
