"""`teamtr improve` end to end on a real gain (issue 36 item 4): the demo's warm team served, chain traffic
from concurrent clients, improve with its default gate and canary judged by the chain verifier, and the
candidate measured independently on fresh tasks. Seeds x conditions; one cell per (seed, condition).

    OMP_NUM_THREADS=1 TEAMTR_TORCH_THREADS=1 nice -n 10 .venv/bin/python benchmarks/improve_end_to_end.py \
        --seeds 0 1 2 3 4 --conditions better worse
    .venv/bin/python benchmarks/improve_end_to_end.py --report

A cell:
1. a run directory holding the shipped warm model (training/demo.py) with fresh adapters (LoRA B = 0: the
   warm model itself) as v1 of every role, served by `teamtr serve` (embedded engine; load_test.py's
   `start_api_server`);
2. `--window` chain prompts (seeded by the cell's seed) sent by `--clients` concurrent httpx clients
   (improve_loop.py's `traffic`): the served episodes improve learns from (`--last WINDOW`);
3. `teamtr improve` with its defaults for the gate (superiority, one-sided 95%, `--held-out 0.25`, KL
   limit delta x stages) and the canary (share 0.5, cap 1000 pairs, 2.5% per side), `--stages STAGES`,
   the training seed the cell's seed, and the condition's training reward, never the verifier:
   `better` trains on `closeness` (partial credit for a near sum), `worse` on `wrong_sum` (a poisoned
   reward: 1 for a well-formed answer that is not the sum). Judges: improve's own choice (`auto`): the
   chain verifier for the gate and, no feedback being sent, for the canary, paired by prompt through
   shadow episodes. Live traffic (fresh prompts, the same clients) runs from the canary's start to the
   decision;
4. the incumbent and the candidate answer `--fresh` fresh chain tasks greedily (none of them served in the
   cell), scored by the verifier here, independently of the gate: the truth the decision is checked
   against (McNemar's exact one-sided test at 95% says whether the candidate is truly better or worse).

Every finished cell is one line of benchmarks/results/improve_end_to_end/cells.jsonl; a rerun skips the
finished cells (an unfinished one starts over). `--report` prints the table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

OUT = HERE / "results" / "improve_end_to_end"
# the condition's training reward and improve's extra arguments (README.md says how they came to be).
# `better` trains on the verifier as the demo does, its stages validated on 128 chain tasks (the demo's
# eval.stage_episodes; improve turns it off by default) so that eval.keep_best undoes a stage that lost
# beyond noise; only the training reward is left to judge it: allowed explicitly, the records naming the
# judge "verifier (the training reward)". `worse` trains on a poisoned reward with improve's default (no
# stage validation) and is judged by the verifier, independent of its reward. Kept as cells of their own,
# both on seed 0 before `better` took its final form: `closeness` (partial credit, no validation) and
# `verifier_last_stage` (the verifier, no validation)
REWARDS = {
    "better": "verifier",
    "worse": "improve_end_to_end:wrong_sum",
    "closeness": "improve_end_to_end:closeness",
    "verifier_last_stage": "verifier",
}
ALLOW = ["--allow-training-reward-judge"]
EXTRA = {"better": [*ALLOW, "--set", "eval.stage_episodes=128"], "verifier_last_stage": ALLOW}
TEAM = "chain"  # load_test.start_api_server serves the run as this team
_INTEGER = re.compile(r"-?\d+")


# ---- the training rewards (improve imports them by `--reward improve_end_to_end:NAME`) ------------------


def _answer(prompt: str, response: str) -> tuple[int, int] | None:
    """(the team's final integer, the prompt's sum), or None when either is missing."""
    from teamtr.tasks.chain import ChainArithmetic

    chain = ChainArithmetic()
    truth, given = chain.answer_for(prompt), chain.extract_answer(response)
    if truth is None or given is None or not _INTEGER.fullmatch(given):
        return None
    return int(given), int(truth)


def closeness(prompt: str, response: str) -> float:
    """Partial credit for a near sum: 1 / (1 + |answer - sum|), 0 for no integer answer. Not the verifier
    (graded, not 0/1), highest exactly where the verifier says right: raising it should raise accuracy."""
    pair = _answer(prompt, response)
    return 0.0 if pair is None else 1.0 / (1.0 + abs(pair[0] - pair[1]))


def wrong_sum(prompt: str, response: str) -> float:
    """A poisoned reward: 1 for a well-formed integer answer that is not the sum, 0 otherwise."""
    pair = _answer(prompt, response)
    return float(pair is not None and pair[0] != pair[1])


# ---- one cell ------------------------------------------------------------------------------------------


def served_run(run: Path) -> Path:
    """The demo's config on the shipped warm model, fresh adapters (B = 0) saved as v1 of every role."""
    import torch

    from teamtr.engines.random_adapters import save_adapters
    from teamtr.training.demo import demo_config, demo_model
    from teamtr.training.run_dir import RunDir

    cfg = demo_config(None, run_dir=str(run))
    cfg = cfg.with_overrides({"team.model": demo_model(cfg)})
    served = RunDir.create(cfg)
    torch.manual_seed(0)
    engine = served.engine("fresh", threads=1)
    save_adapters(engine, run, sorted({r.adapter for r in served.roles if r.adapter}), version=1)
    return run


def state(work: Path) -> dict[str, Any]:
    try:
        return json.loads((work / "state.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


async def run_improve(
    url: str, run: Path, work: Path, args: argparse.Namespace, seed: int, condition: str, prompts: dict
) -> dict[str, Any]:
    import httpx
    from improve_loop import traffic
    from load_test import ADMIN_KEY

    window_log: list[dict] = []
    stop = asyncio.Event()
    sender = asyncio.create_task(traffic(url, args.clients, prompts["window"], stop, window_log))
    while len(window_log) < args.window:  # the window improve learns from
        if sender.done():
            sender.result()
        await asyncio.sleep(0.2)
    stop.set()
    await sender
    window_s = window_log[-1]["t"] + window_log[-1]["latency"] - window_log[0]["t"]
    command = [sys.executable, "-m", "teamtr.cli.main", "improve", str(run), "--url", url]
    command += ["--admin-key", ADMIN_KEY, "--team", TEAM, "--work-dir", str(work), "--last", str(args.window)]
    command += ["--reward", REWARDS[condition], *EXTRA.get(condition, [])]
    command += ["--stages", str(args.stages), "--set", f"seed={seed}", *args.improve_args]
    env = {
        **os.environ,
        "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "COLUMNS": "400",
    }
    started = time.time()
    process = await asyncio.create_subprocess_exec(
        *command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env
    )
    lines: list[tuple[float, str]] = []
    live_log: list[dict] = []
    live_stop = asyncio.Event()

    async def read() -> None:
        assert process.stdout is not None
        async for raw in process.stdout:
            lines.append((time.time(), raw.decode(errors="replace").rstrip()))

    async def live() -> None:
        """Fresh prompts from the canary's start until improve ends."""
        while state(work).get("phase") not in ("canary", "deciding"):
            if process.returncode is not None or live_stop.is_set():
                return
            await asyncio.sleep(0.5)
        await traffic(url, args.clients, prompts["live"], live_stop, live_log)

    reader, sender = asyncio.create_task(read()), asyncio.create_task(live())
    await process.wait()
    await reader
    live_stop.set()
    await sender
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        metrics = (await http.get("/metrics")).text
    return {
        "returncode": process.returncode,
        "started": started,
        "ended": time.time(),
        "lines": lines,
        "window_requests": window_log,
        "window_s": window_s,
        "live_requests": live_log,
        "metrics_improve": [m for m in metrics.splitlines() if m.startswith("teamtr_improve")],
    }


def fresh_tasks(n: int, seed: int, served: set[str]) -> list:
    """n chain tasks of their own seed stream, none of whose prompts the cell served."""
    from teamtr.tasks import get_task

    out: list = []
    for t in get_task("chain").generate(4 * n, seed=5_000_000 + seed):
        if t.prompt not in served and len(out) < n:
            out.append(t)
    return out


def fresh_accuracy(run: Path, st: dict[str, Any], tasks: list) -> dict[str, Any]:
    """Incumbent and candidate answer the same fresh tasks greedily (one engine, gate.py's layout)."""
    from teamtr.improve.gate import INCUMBENT_SUFFIX, _roles, gate_engine
    from teamtr.improve.stats import gate_test
    from teamtr.training.run_dir import RunDir

    served = RunDir(run)
    incumbent = {a: (int(v), str(p)) for a, (v, p) in st["incumbent"].items()}
    candidate = {a: Path(p) for a, p in (st.get("candidate_dirs") or {}).items()}
    engine = gate_engine(served, incumbent, candidate, threads=1)
    task = served.task()
    rewards = {}
    for name, roles in (("incumbent", _roles(served.roles, INCUMBENT_SUFFIX)), ("candidate", served.roles)):
        team = served.team(roles, engine, temperature=0.0, name=name)
        rewards[name] = [t.reward for t in team.run(tasks, group_size=1, verifier=task, seed=0)]
    better = gate_test(rewards["candidate"], rewards["incumbent"], 0.0, 1.0, 0.95)
    worse = gate_test(rewards["incumbent"], rewards["candidate"], 0.0, 1.0, 0.95)
    return {
        "tasks": len(tasks),
        "incumbent": statistics.fmean(rewards["incumbent"]),
        "candidate": statistics.fmean(rewards["candidate"]),
        "won": better.wins,
        "lost": better.losses,
        "p_better": better.p_value,
        "p_worse": worse.p_value,
        "truly": "better" if better.passed else "worse" if worse.passed else "not resolved",
    }


def phase_times(out: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, float | None]:
    """Minutes of each step: from improve's own lines (training, gating starts) and decisions.jsonl."""

    def line_at(prefix: str) -> float | None:
        return next((t for t, line in out["lines"] if re.search(prefix, line)), None)

    def record_at(*events: str) -> float | None:
        return next((r["time_ns"] / 1e9 for r in records if r["event"] in events), None)

    training, gating = line_at(r"improve \d+: training"), line_at(r"improve \d+: gating")
    gate, canary = record_at("gate"), record_at("canary_started")
    decided = record_at("promoted", "rolled_back", "no_change")

    def minutes(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round((b - a) / 60, 2)

    return {
        "window": round(out["window_s"] / 60, 2),
        "collect": minutes(out["started"], training),
        "train": minutes(training, gating),
        "gate": minutes(gating, gate),
        "canary": minutes(canary, decided),
        "improve": minutes(out["started"], out["ended"]),
    }


def run_cell(seed: int, condition: str, args: argparse.Namespace) -> dict[str, Any]:
    from load_test import start_api_server

    from teamtr.graphs.run_layout import read_records
    from teamtr.tasks import get_task

    t0 = time.time()
    load_before = os.getloadavg()[0]
    cell_dir = args.work / f"seed{seed}-{condition}"
    shutil.rmtree(cell_dir, ignore_errors=True)  # an unfinished cell starts over
    cell_dir.mkdir(parents=True)
    run, work = served_run(cell_dir / "run"), cell_dir / "improve"
    chain = get_task("chain")
    prompts = {
        "window": [t.prompt for t in chain.generate(args.window, seed=1_000_000 + seed)],
        "live": [t.prompt for t in chain.generate(4000, seed=2_000_000 + seed)],
    }
    server, url = start_api_server(run, "embedded", None, cell_dir / "server.log")
    try:
        out = asyncio.run(run_improve(url, run, work, args, seed, condition, prompts))
    finally:
        server.terminate()
        server.wait(60)
    records = read_records(work / "decisions.jsonl")
    st = state(work)
    if out["returncode"] != 0 or st.get("phase") != "done":
        tail = "\n".join(line for _, line in out["lines"][-40:])
        raise RuntimeError(f"improve failed (rc {out['returncode']}):\n{tail}")
    served_prompts = set(prompts["window"]) | set(prompts["live"][: len(out["live_requests"]) + args.clients])
    accuracy = fresh_accuracy(run, st, fresh_tasks(args.fresh, seed, served_prompts))
    gate = next((r for r in records if r["event"] == "gate"), None)
    final = next((r for r in records if r["event"] in ("promoted", "rolled_back")), None)
    canary_at = next((r["time_ns"] / 1e9 for r in records if r["event"] == "canary_started"), None)
    decided_at = final["time_ns"] / 1e9 if final else None
    canary_requests = (
        sum(canary_at <= r["t"] <= decided_at for r in out["live_requests"])
        if canary_at and decided_at
        else 0
    )
    requests = out["window_requests"] + out["live_requests"]
    g = (gate or {}).get("figures") or {}
    c = (final or {}).get("figures") or {}
    cell = {
        "seed": seed,
        "condition": condition,
        "reward": REWARDS[condition],
        "decision": st.get("outcome") or st.get("decision"),
        "judges": st.get("judges"),
        "fresh": accuracy,
        "window": {
            "requests": len(out["window_requests"]),
            "episodes": st["window"]["episodes"],
            "distinct_prompts": st["window"]["prompts"],
            "held_out": st["window"]["held_out"],
        },
        "gate": {
            k: g.get(k)
            for k in (
                "incumbent_reward",
                "candidate_reward",
                "difference",
                "lower_bound",
                "p_value",
                "wins",
                "losses",
                "prompts",
                "method",
                "kl",
                "kl_limit",
                "judge",
            )  # fmt: skip
        }
        | {"reasons": (gate or {}).get("reasons") or st.get("gate", {}).get("reasons")},
        "canary": {
            k: c.get(k)
            for k in (
                "pairs",
                "candidate_episodes",
                "incumbent_episodes",
                "candidate_reward",
                "incumbent_reward",
                "mean_difference",
                "lower_bound",
                "upper_bound",
                "paired_by_prompt",
                "shadow_episodes",
                "lost_pairs",
                "mixed_episodes",
                "judge",
            )  # fmt: skip
        }
        | {"requests_served": canary_requests, "reason": (final or {}).get("reason")},
        "minutes": phase_times(out, records),
        "requests": len(requests),
        "failed_requests": sum(not r["ok"] for r in requests),
        "candidate_versions": st.get("candidate_versions"),
        "settings": {
            "window": args.window,
            "clients": args.clients,
            "stages": args.stages,
            "fresh": args.fresh,
            "improve_args": args.improve_args,
        },
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "commit": os.environ.get("TEAMTR_SOURCE_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
        ).stdout.strip(),  # fmt: skip
        "metrics_improve": out["metrics_improve"],
        "seconds": round(time.time() - t0, 1),
    }
    if not args.keep:
        shutil.rmtree(cell_dir, ignore_errors=True)
    return cell


# ---- the table -----------------------------------------------------------------------------------------


def report(cells: list[dict[str, Any]]) -> str:
    rows = [
        "| seed | condition | decision | fresh: incumbent -> candidate (truly) | gate: held-out diff (won/lost of n), p "
        "| canary: pairs, mean diff [bounds] | requests: window + canary | minutes: train / gate / canary | cell min |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in sorted(cells, key=lambda c: (c["condition"], c["seed"])):
        f, g, k, m = c["fresh"], c["gate"], c["canary"], c["minutes"]
        gate = (
            f"{g['difference']:+.3f} ({g['wins']}/{g['losses']} of {g['prompts']}), p {g['p_value']:.3g}"
            if g.get("difference") is not None
            else "-"
        )
        canary = (
            f"{k['pairs']}, {k['mean_difference']:+.3f} [{k['lower_bound']:+.3f}, {k['upper_bound']:+.3f}]"
            if k.get("pairs")
            else "-"
        )
        why = [
            "sign test" if "not shown" in r else "KL " + r.split(":")[0].removeprefix("role ")
            for r in (g.get("reasons") or [])
            if c["decision"] == "refused"
        ]
        decision = f"**{c['decision']}**" + (f" ({', '.join(why)})" if why else "")
        rows.append(
            f"| {c['seed']} | {c['condition']} | {decision} | {f['incumbent']:.1%} -> {f['candidate']:.1%} "
            f"({f['truly']}) | {gate} | {canary} | {c['window']['requests']} + {k['requests_served']} "
            f"| {m['train']} / {m['gate']} / {m['canary'] if m['canary'] is not None else '-'} "
            f"| {c['seconds'] / 60:.1f} |"
        )
    rows.append("")
    for condition in dict.fromkeys(c["condition"] for c in cells):  # judged by the truth, whatever the reward
        mine = [c for c in cells if c["condition"] == condition]
        better = [c for c in mine if c["fresh"]["truly"] == "better"]
        worse = [c for c in mine if c["fresh"]["truly"] == "worse"]
        gains = ", ".join(f"{c['fresh']['candidate'] - c['fresh']['incumbent']:+.3f}" for c in mine)
        rows.append(
            f"{condition}: {len(better)} of {len(mine)} candidates truly better on the fresh tasks, "
            f"{sum(c['decision'] == 'promoted' for c in better)} of them promoted (rule: >= 4 of 5); "
            f"{len(worse)} truly worse, {sum(c['decision'] == 'promoted' for c in worse)} of them promoted "
            f"(rule: 0); gains {gains}"
        )
    failed = sum(c["failed_requests"] for c in cells)
    rows.append(f"failed requests {failed} of {sum(c['requests'] for c in cells)}")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--conditions", nargs="+", choices=tuple(REWARDS), default=["better", "worse"])
    parser.add_argument("--window", type=int, default=1000, help="served requests improve learns from")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--stages", type=int, default=8, help="improve --stages (the demo's 8)")
    parser.add_argument("--fresh", type=int, default=1000, help="fresh tasks the truth is measured on")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--improve-arg", dest="improve_args", action="append", default=[], metavar="ARG",
        help="one more argument for every cell's `teamtr improve` (repeat: --improve-arg=--held-out --improve-arg=0.5)",
    )  # fmt: skip
    parser.add_argument("--work", type=Path, default=Path("/tmp/improve_end_to_end"))
    parser.add_argument("--keep", action="store_true", help="keep each cell's run and improve directories")
    parser.add_argument(
        "--report", action="store_true", help="print the table of the finished cells and stop"
    )
    args = parser.parse_args()
    os.environ.setdefault("TEAMTR_TORCH_THREADS", "1")
    cells_file = args.out / "cells.jsonl"
    cells = [json.loads(line) for line in cells_file.read_text().splitlines()] if cells_file.is_file() else []
    if not args.report:
        args.out.mkdir(parents=True, exist_ok=True)
        for seed in args.seeds:
            for condition in args.conditions:
                if any(c["seed"] == seed and c["condition"] == condition for c in cells):
                    continue
                print(f"cell seed {seed} {condition} ...", flush=True)
                cell = run_cell(seed, condition, args)
                with open(cells_file, "a") as f:
                    f.write(json.dumps(cell) + "\n")
                cells.append(cell)
                print(json.dumps({k: cell[k] for k in ("seed", "condition", "decision", "fresh", "minutes")}),
                      flush=True)  # fmt: skip
    print(report(cells))


if __name__ == "__main__":
    main()
