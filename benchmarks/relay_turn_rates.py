"""What a relay cell's training did to each kind of turn: role 1's right / slip / stray rates and the blind
roles' correction and stray rates per turn (relay_study.turn_rates), at T = 1 on the held-out tasks,
after chosen stages of finished cells (their run directories under <out>/runs).

    .venv/bin/python benchmarks/relay_turn_rates.py n6/l0/d0.3/seed0/teamtr n6/l0/d0.3/seed0/naive \
        [--stages 0 1 4] [--episodes 300] [--out benchmarks/results/relay_study/main]

Appends one line per (cell, stage) to <out>/turn_rates.jsonl and prints it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from relay_study import episodes, turn_rates  # noqa: E402
from team_size_study import append_cell  # noqa: E402


def measure(run_dir: Path, stage: int, count: int) -> dict[str, float]:
    from teamtr.training.run_dir import RunDir

    run = RunDir(run_dir)
    engine = run.engine("latest", version=run.stage_versions(stage)) if stage else run.engine("fresh")
    tasks, trajectories = episodes(engine, run, 0, 1.0, count)
    rates = turn_rates(tasks, trajectories)
    return {
        "accuracy_t1": sum(float(t.reward) for t in trajectories) / len(trajectories),
        "role1_right": 1.0 - rates["slip"] - rates["first_stray"],  # neither slip nor stray: the value
        **rates,
    }


def main(argv: list[str] | None = None) -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cells", nargs="+", help="cell keys, e.g. n6/l0/d0.3/seed0/teamtr")
    p.add_argument("--stages", nargs="+", type=int, default=[0, 1, 4])
    p.add_argument("--episodes", type=int, default=300)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/relay_study/main"))
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    for key in a.cells:
        for stage in a.stages:
            rates = measure(a.out / "runs" / key, stage, a.episodes)
            record = {"cell": key, "stage": stage, "episodes": a.episodes, **rates}
            append_cell(a.out / "turn_rates.jsonl", record)
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in record.items()}))


if __name__ == "__main__":
    main()
