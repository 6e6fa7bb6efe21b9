"""What a graph run's team does on its held-out tasks: mean reward, the paths taken, a few transcripts.

    python benchmarks/graph_run_probe.py runs/word_problems --temperature 0 --episodes 40 --show 8

Any graph run (`team.graph`): the untrained team (stage 0) unless --stage is given. Used to size
examples/word_problems.py on SmolLM2 (benchmarks/results/word_problems_smollm2/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import collections

from teamtr.training.run_dir import RunDir


async def probe(run_dir: str, temperature: float, episodes: int, show: int, stage: int) -> None:
    run = RunDir(run_dir)
    engine = run.engine(version=run.stage_versions(stage), threads=2)
    team = run.team(run.roles, engine, temperature=temperature, name="probe")
    tasks = run.eval_task().generate(episodes, 0)
    episodes_run = await asyncio.gather(*[team.arun(task, seed=i) for i, task in enumerate(tasks)])
    rewards = [e.reward for e in episodes_run]
    print(f"T={temperature} stage {stage}: mean reward {sum(rewards) / len(rewards):.3f} over {len(rewards)}")
    print("paths:", dict(collections.Counter(" > ".join(t.role for t in e.turns) for e in episodes_run)))
    for task, episode in list(zip(tasks, episodes_run, strict=True))[:show]:
        print(f"---- {task.prompt} -> {task.answer} (reward {episode.reward})")
        for turn in episode.turns:
            print(f"  [{turn.role}] {turn.text!r}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--episodes", type=int, default=40)
    parser.add_argument("--show", type=int, default=8)
    parser.add_argument("--stage", type=int, default=0)
    args = parser.parse_args()
    asyncio.run(probe(args.run_dir, args.temperature, args.episodes, args.show, args.stage))
