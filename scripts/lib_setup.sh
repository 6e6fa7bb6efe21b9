# Sourced by scripts/setup_*.sh: what a failed install means.
# On a developer machine a missing server is a warning (its tests skip, saying why) and the script exits 0;
# under CI (CI=true) it exits 1, because a green CI run must mean that every part of the suite ran
# (tests/support/ci_strict.py turns those tests' skips into failures there too).

under_ci() {
    case "${CI:-}" in [Tt][Rr][Uu][Ee] | 1 | [Yy][Ee][Ss]) return 0 ;; *) return 1 ;; esac
}

# setup_failed NAME MESSAGE: report the failure and exit (1 under CI, 0 with a warning elsewhere)
setup_failed() {
    if under_ci; then
        echo "$1: ERROR: $2 (CI=true: a failed install fails the run)" >&2
        exit 1
    fi
    echo "$1: WARNING: $2; the tests that need it will be skipped" >&2
    exit 0
}
