#!/usr/bin/env bash
# The relay study of issue 37 (design, prediction and decision rule: benchmarks/results/relay_study/
# addendum_delta06.md). Resumable: every finished cell is a line of OUT/cells.jsonl and is skipped on a
# rerun. TeamTR and naive in every setting first, then the other baselines, then naive at TeamTR's tokens,
# so the primary comparison is complete first. Run it in the background at low priority:
#   nohup nice -n 15 bash benchmarks/relay_study_main.sh > relay_main.log 2>&1 &
set -euo pipefail
out=${1:-benchmarks/results/relay_study/main_delta06}
python=${PYTHON:-.venv/bin/python}
export OMP_NUM_THREADS=1 TEAMTR_TORCH_THREADS=1
for arms in "teamtr naive" "sequential_grpo shared_adapter" "naive_tokens"; do
    # shellcheck disable=SC2086  # the arms are words
    "$python" benchmarks/relay_study.py --arms $arms --sizes 4 2 --control-size 4 --deltas 0.6 --seeds 10 \
        --cell-seeds --out "$out"
done
