"""Scaling out, measured in one run: rollout throughput with 1 vs 2 vLLM replicas, and the wall time of a
TeamTR update with 1 vs 2 data-parallel ranks (docs/scale.md reads the ratios).

    nice -n 5 .venv/bin/python benchmarks/scale.py [--rounds 3] [--requests 32] [--tokens 32] [--skip-vllm]

Rollouts: two real vLLM CPU servers of the tiny test model (1 GiB KV cache each) are started once; each
round sends `--requests` concurrent completions of `--tokens` new tokens through a `VLLMReplicaEngine`
(engines/vllm_replicas.py) over the first server only, then over both, and counts completion tokens per
second. Updates: one stage of the chain task (3 updates) with `teamtr train` in one process, then with
`teamtr train --nproc 2` (torchrun, gloo), each in a fresh run directory; the "update" records'
`seconds` (the update step on rank 0, collectives included; rollouts excluded) are averaged. Rounds
alternate so that the machine's load hits both sides alike; the load average is printed before and after.
Writes the figures as JSON (`--out`, default benchmarks/results/scale.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from teamtr.engines.vllm_replica_launch import launch_replicas
from teamtr.engines.vllm_replicas import VLLMReplicaEngine
from teamtr.engines.vllm_server import VLLMServerConfig
from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.run_layout import read_metrics
from teamtr.training.warmstart import tiny_random_model

REPO = Path(__file__).resolve().parent.parent


async def rollout_round(engine: VLLMReplicaEngine, requests: int, tokens: int, seed: int) -> float:
    """Completion tokens per second of `requests` concurrent completions."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 60) for _ in range(16)] for _ in range(requests)]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=tokens, seed=seed)
    t0 = time.perf_counter()
    gens = await asyncio.gather(*(engine.generate(p, adapter=None, sampling=sampling) for p in prompts))
    seconds = time.perf_counter() - t0
    await engine.aclose()
    return sum(len(g.completion_ids) for g in gens) / seconds


def rollouts(model: Path, rounds: int, requests: int, tokens: int, work: Path) -> dict:
    config = VLLMServerConfig(model_dir=str(model), served_model_name="tiny", max_loras=4, log_path=None)
    servers = launch_replicas(config, 2)
    try:
        one = VLLMReplicaEngine({"base": servers[:1]}, probe_interval_s=0)
        two = VLLMReplicaEngine({"base": servers}, probe_interval_s=0)
        asyncio.run(rollout_round(two, requests, tokens, seed=0))  # warm-up: null adapters, first batches
        rates: dict[int, list[float]] = {1: [], 2: []}
        for r in range(rounds):
            for n, engine in ((1, one), (2, two)):
                rates[n].append(asyncio.run(rollout_round(engine, requests, tokens, seed=r + 1)))
        one.close()
        two.close()
    finally:
        for server in servers:
            server.stop()
    median = {n: statistics.median(v) for n, v in rates.items()}
    return {
        "tokens_per_s": {str(n): v for n, v in rates.items()},
        "median_tokens_per_s": {str(n): m for n, m in median.items()},
        "ratio_2_over_1": median[2] / median[1],
    }


def train_config(model: Path, run_dir: Path) -> dict:
    return {
        "seed": 0,
        "stages": 1,
        "run_dir": str(run_dir),
        "task": {"name": "chain"},
        "team": {"model": str(model), "lora_rank": 8, "roles": "teamtr.graphs.chain_team:chain_roles"},
        "rollout": {"prompts_per_update": 8, "group_size": 4},
        "optim": {"lr": 3e-3, "epochs": 2, "minibatch_messages": 32},
        "eval": {"stage_episodes": 0, "final_episodes": 1},
        "trust_region": {"heldout_episodes": 0},  # held-out rollouts inside the update: not its cost
        "torch_threads": 1,
    }


def update_seconds(model: Path, nproc: int, work: Path, tag: str) -> float:
    """Mean `seconds` of the stage's update records, trained by `teamtr train --nproc nproc`."""
    config = work / f"{tag}.yaml"
    config.write_text(yaml.safe_dump(train_config(model, work / tag)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "teamtr.cli", "train", str(config), "--nproc", str(nproc)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return statistics.mean(r["seconds"] for r in read_metrics(work / tag, "update"))


def updates(model: Path, rounds: int, work: Path) -> dict:
    seconds: dict[int, list[float]] = {1: [], 2: []}
    for r in range(rounds):
        for nproc in (1, 2):
            seconds[nproc].append(update_seconds(model, nproc, work, f"r{r}-n{nproc}"))
    median = {n: statistics.median(v) for n, v in seconds.items()}
    return {
        "update_seconds": {str(n): v for n, v in seconds.items()},
        "median_update_seconds": {str(n): m for n, m in median.items()},
        "speedup_2_over_1": median[1] / median[2],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--skip-vllm", action="store_true", help="only the data-parallel updates")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "scale.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="teamtr-scale-") as tmp:
        work = Path(tmp)
        model = Path(tiny_random_model(work / "model", seed=0))
        result = {"machine": {"cpus": os.cpu_count(), "load_before": os.getloadavg()}}
        if not args.skip_vllm:
            result["rollouts"] = rollouts(model, args.rounds, args.requests, args.tokens, work)
            print("rollouts, 2 replicas / 1:", json.dumps(result["rollouts"], indent=1))
        result["updates"] = updates(model, args.rounds, work)
        print("updates, 1 rank / 2 ranks:", json.dumps(result["updates"], indent=1))
        result["machine"]["load_after"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result["machine"]))


if __name__ == "__main__":
    main()
