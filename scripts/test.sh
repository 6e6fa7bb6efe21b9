#!/usr/bin/env bash
# The whole test suite, as `make test` and CI run it.
# Servers the tests need (vLLM, Phoenix) get their own virtual environments from scripts/setup_*.sh;
# the tests' session fixtures start and stop the servers themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TEAMTR_TORCH_THREADS=${TEAMTR_TORCH_THREADS:-1}
# A setup script exits 1 only under CI=true, when its install failed (scripts/lib_setup.sh): that ends the run.
for setup in scripts/setup_*.sh; do
    [ -e "$setup" ] || continue
    bash "$setup"
done
.venv/bin/ruff check .
.venv/bin/python -m pytest -q -rs --durations=25 "$@"  # the slowest tests: where the 30-minute aim goes
