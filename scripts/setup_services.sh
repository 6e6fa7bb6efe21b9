#!/usr/bin/env bash
# Installs the system services the replica tests and benchmarks/replicas_load.py start themselves
# (serving/local_replicas.py): PostgreSQL 15 (its initdb / pg_ctl) and HAProxy, from Debian's packages.
# Idempotent: does nothing when both are there (TEAMTR_PG_BIN, default /usr/lib/postgresql/15/bin;
# TEAMTR_HAPROXY, default haproxy on PATH). Installing needs root (apt-get), as CI runs `make test`.
# On a failure it says why; then, on a developer machine, it exits 0 (those tests skip), and under CI
# (CI=true) it exits 1 (scripts/lib_setup.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/lib_setup.sh
PG_BIN=${TEAMTR_PG_BIN:-/usr/lib/postgresql/15/bin}
HAPROXY=${TEAMTR_HAPROXY:-haproxy}
APT_GET=${APT_GET:-apt-get}

have_all() { [ -x "$PG_BIN/initdb" ] && [ -x "$PG_BIN/pg_ctl" ] && command -v "$HAPROXY" >/dev/null 2>&1; }
have_all && exit 0
if [ "$(id -u)" != 0 ]; then
    setup_failed setup_services "PostgreSQL 15 or HAProxy is missing and installing them needs root (apt-get install postgresql-15 haproxy)"
fi
echo "setup_services: installing postgresql-15 and haproxy (apt-get)"
log=$(mktemp)
export DEBIAN_FRONTEND=noninteractive
if { "$APT_GET" install -y -q postgresql-15 haproxy >"$log" 2>&1 \
    || { "$APT_GET" update -q >>"$log" 2>&1 && "$APT_GET" install -y -q postgresql-15 haproxy >>"$log" 2>&1; }; } \
    && have_all; then
    echo "setup_services: done"
    rm -f "$log"
    exit 0
fi
tail -n 20 "$log" >&2
rm -f "$log"
setup_failed setup_services "could not install postgresql-15 and haproxy with $APT_GET (last lines above)"
