"""benchmarks/chain_dependence.py: each adder's reduction accuracy and the final answer's dependence on the
message before it, on hand-written episodes (the counting) and on a real tiny chain run (the command)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from teamtr.graphs.trajectory import Trajectory, Turn
from teamtr.tasks.chain import ChainArithmetic

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "chain_dependence.py"


def load_script():
    spec = importlib.util.spec_from_file_location("chain_dependence", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def episode(task_id: str, messages: list[str], reward: float) -> Trajectory:
    turns = [Turn(f"adder{k}", f"adder{k}", 0, [1], [2], [-0.1], m + "\n") for k, m in enumerate(messages, 1)]
    return Trajectory(task_id=task_id, turns=turns, reward=reward)


def test_reduction_accuracy_and_the_final_answers_split():
    cd = load_script()
    assert cd.reduced("3+7+9+5") == "10+9+5" and cd.reduced("19+5") == "24" and cd.reduced("24") is None
    tasks = ChainArithmetic().generate(3, seed=0)
    a, b, c = (t.meta["operands"] for t in tasks)
    total = [sum(x) for x in (a, b, c)]
    episodes = [
        # a faithful chain: every message the reduction of the one before
        episode(tasks[0].id, [ChainArithmetic.demonstration(a, k) for k in (1, 2, 3)], 1.0),
        # adder2 wrong, the last adder right anyway (it read the sum off the prompt)
        episode(tasks[1].id, [ChainArithmetic.demonstration(b, 1), "1+1", str(total[1])], 1.0),
        # adder2 right, the last adder wrong
        episode(tasks[2].id, [ChainArithmetic.demonstration(c, 1), ChainArithmetic.demonstration(c, 2),
                              str(total[2] + 1)], 0.0),
    ]  # fmt: skip
    result = cd.dependence(tasks, episodes)
    assert result["episodes"] == 3 and abs(result["team_accuracy"] - 2 / 3) < 1e-12
    assert result["reduction_accuracy"] == [1.0, 2 / 3, 1 / 3]  # episode 2's "2" is not the reduction of "1+1"
    assert result["final_right_if_previous_right"] == {"rate": 0.5, "episodes": 2}
    assert result["final_right_if_previous_wrong"] == {"rate": 1.0, "episodes": 1}


@pytest.fixture(scope="module")
def tiny_chain_run(tiny_model_dir, tmp_path_factory) -> Path:
    """One stage of `teamtr train` on the seconds-sized model (the chain task's own team)."""
    root = tmp_path_factory.mktemp("chain-run")
    config = {
        "stages": 1, "run_dir": str(root / "run"), "team": {"model": str(tiny_model_dir)},
        "rollout": {"prompts_per_update": 2, "group_size": 2}, "optim": {"epochs": 1, "minibatch_messages": 8},
        "eval": {"stage_episodes": 2, "final_episodes": 2},
    }  # fmt: skip
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    train = subprocess.run([sys.executable, "-m", "teamtr.cli.main", "train", str(root / "config.yaml")],
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    assert train.returncode == 0, train.stderr[-3000:]
    return root / "run"


@pytest.mark.parametrize("stage", [["--stage", "0"], []])  # the warm model itself; the newest adapters
def test_the_command_reads_a_chain_run(tiny_chain_run, stage):
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(tiny_chain_run), *stage, "--tasks", "6"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["episodes"] == 6 and len(result["reduction_accuracy"]) == 3
    assert all(0.0 <= r <= 1.0 for r in result["reduction_accuracy"])
    split = [result[f"final_right_if_previous_{k}"]["episodes"] for k in ("right", "wrong")]
    assert sum(split) == 6
