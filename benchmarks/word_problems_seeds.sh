#!/usr/bin/env bash
# Issue 34's done-when on the user graph of examples/word_problems.py: examples/word_problems.yaml trained
# on seeds 0-2 (2 stages each), then each seed's greedy accuracy on the 300 held-out tasks, stage 2 against
# the base, and the decision (benchmarks/word_problems_report.py; rule in
# benchmarks/results/word_problems_smollm2/seeds.md). Resumable: a finished training run resumes to "done",
# a finished evaluation is skipped. Training wall time is written per seed (a resumed run's time is partial).
set -euo pipefail
out=${1:-benchmarks/results/word_problems_smollm2/seeds}
runs=${RUNS:-runs}
teamtr=${TEAMTR:-.venv/bin/teamtr}
python=${PYTHON:-.venv/bin/python}
mkdir -p "$out"
[ -f examples/word_problems_heldout300.jsonl ] || "$python" examples/word_problems.py
for seed in 0 1 2; do
    run="$runs/wp_seed$seed"
    if [ ! -f "$out/seed$seed.train_seconds" ]; then
        start=$(date +%s)
        "$teamtr" train examples/word_problems.yaml --run-dir "$run" --set "seed=$seed"
        echo $(( $(date +%s) - start )) > "$out/seed$seed.train_seconds"
        cp "$run/metrics.jsonl" "$out/seed$seed.metrics.jsonl"
    fi
    if [ ! -f "$out/seed$seed/result.json" ]; then
        "$teamtr" eval "$run" --stage 2 --data examples/word_problems_heldout300.jsonl --limit 300 \
            --verifier examples.word_problems:verify --threads 2 --out "$out/seed$seed"
    fi
done
"$python" benchmarks/word_problems_report.py "$out"
