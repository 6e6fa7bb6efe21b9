#!/usr/bin/env bash
# Installs Arize Phoenix (a real OTLP trace receiver with a UI) into its own virtual environment,
# .phoenix-venv, for the tracing tests. Idempotent: does nothing when it is already installed.
# On an install failure it says why; then, on a developer machine, it exits 0 (the Phoenix tests skip),
# and under CI (CI=true) it exits 1 (scripts/lib_setup.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/lib_setup.sh
VENV=${TEAMTR_PHOENIX_VENV:-.phoenix-venv}
PHOENIX_SPEC=${PHOENIX_SPEC:-arize-phoenix}
PYTHON=${PYTHON:-python3}
if [ -x "$VENV/bin/phoenix" ] && "$VENV/bin/python" -c "import phoenix" >/dev/null 2>&1; then
    exit 0
fi
echo "setup_phoenix: installing $PHOENIX_SPEC into $VENV (about 1 minute, ~850 MB)"
log=$(mktemp)
if "$PYTHON" -m venv "$VENV" >"$log" 2>&1 \
    && "$VENV/bin/python" -m pip install -q --upgrade pip >>"$log" 2>&1 \
    && "$VENV/bin/python" -m pip install -q "$PHOENIX_SPEC" >>"$log" 2>&1 \
    && "$VENV/bin/python" -c "import phoenix" >>"$log" 2>&1; then
    echo "setup_phoenix: done"
    rm -f "$log"
    exit 0
fi
tail -n 20 "$log" >&2
rm -rf "$VENV" "$log"
setup_failed setup_phoenix "could not install $PHOENIX_SPEC into $VENV (last lines above)"
