"""`teamtr improve --watch` under load: 32 concurrent clients keep the served team busy while the
continuous improve loop runs several rounds (each: train, gate, canary, promote or roll back, then wait
for enough new traffic, longer after a setback); every request, the canary share, the versions served
and the watch's reports are recorded on one timeline, plotted to a PNG (docs/improve.md) beside the
loop's own timeline (improve/timeline.py), and failed requests are counted (must be 0).

    nice -n 5 .venv/bin/python benchmarks/improve_loop.py --clients 32 --rounds 4 --out benchmarks/results/improve_loop

The team is the chain demo team on a tiny random model (benchmarks/load_test.py's setup and server), so
the figure shows the loop's mechanics under traffic, not a gain in accuracy: the gate is an explicit
non-inferiority test with a margin of 2 (the chain verifier scores this model 0 everywhere: anything
passes); the canary is the default sequential test, judged by the training proxy (explicitly allowed:
the team has no other signal), so a round is promoted when the candidate starts more answers with a
digit and rolled back at the cap when it does not, and the watch backs off after a rollback
(`--canary open`: a margin of 2 instead, so every round is promoted and the next starts as soon as the
traffic is there). Pieces of benchmarks/load_test.py are reused.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from load_test import ADMIN_KEY, ROLES, ROLES_FACTORY, start_api_server, tiny_model  # noqa: E402

from teamtr.engines.embedded import EmbeddedEngine, LoraSettings  # noqa: E402
from teamtr.engines.random_adapters import randomise_adapters, save_adapters  # noqa: E402
from teamtr.tasks import get_task  # noqa: E402

FIGURES = ("difference", "lower_bound", "upper_bound", "pairs", "candidate_episodes", "incumbent_episodes")
FIGURES += ("candidate_reward", "incumbent_reward", "mixed_episodes")  # of each decision, in the summary


def starts_with_digit(prompt: str, response: str) -> float:
    """The improve run's training reward (`--reward improve_loop:starts_with_digit`): a proxy with some
    signal on the tiny random model (the chain verifier scores it 0 everywhere, so every update would
    leave the policy where it was and improve would end with no change)."""
    return float(response[:1].isdigit())


def served_run(model_dir: Path, run: Path) -> Path:
    """v1 of every role; adder2's is a damaged (random) version."""
    run.mkdir(parents=True, exist_ok=True)
    team = {"roles": ROLES_FACTORY, "model": str(model_dir), "lora_rank": 4, "lora_alpha": 8}
    (run / "config.yaml").write_text(yaml.safe_dump({"task": {"name": "chain"}, "team": team}))
    engine = EmbeddedEngine(
        model_dir, adapters={r: None for r in ROLES}, threads=1, lora=LoraSettings(r=4, alpha=8)
    )
    randomise_adapters(engine, ["adder2"], std=0.5, seed=7)
    save_adapters(engine, run, ROLES, version=1)
    return run


async def traffic(url: str, clients: int, prompts: list[str], stop: asyncio.Event, log: list[dict]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:

        async def client(k: int) -> None:
            i = k
            while not stop.is_set():
                t0 = time.time()
                try:
                    r = await http.post(
                        "/v1/chat/completions",
                        json={
                            "model": "chain",
                            "messages": [{"role": "user", "content": prompts[i % len(prompts)]}],
                        },
                    )
                    ok = r.status_code == 200
                    versions = r.json()["teamtr"]["adapter_versions"] if ok else None
                    log.append({"t": t0, "latency": time.time() - t0, "ok": ok, "versions": versions})
                except httpx.HTTPError as e:
                    log.append({"t": t0, "latency": time.time() - t0, "ok": False, "error": str(e)})
                i += clients

        await asyncio.gather(*(client(k) for k in range(clients)))


async def watch(url: str, stop: asyncio.Event, log: list[dict]) -> None:
    """The registry (versions, canary share) and the watch's report, twice a second."""
    async with httpx.AsyncClient(
        base_url=url, timeout=60, headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    ) as http:
        while not stop.is_set():
            listed = (await http.get("/admin/adapters")).json()
            report = (await http.get("/admin/improve")).json().get("chain")
            c = listed.get("candidate")
            log.append(
                {
                    "t": time.time(),
                    "current": listed["current"],
                    "share": c["share"] if c else None,
                    "phase": report["phase"] if report else None,
                }
            )
            await asyncio.sleep(0.5)


async def run_loop(url: str, run: Path, args: argparse.Namespace, prompts: list[str]) -> dict:
    requests: list[dict] = []
    registry: list[dict] = []
    stop = asyncio.Event()
    tasks = [asyncio.create_task(traffic(url, args.clients, prompts, stop, requests))]
    tasks.append(asyncio.create_task(watch(url, stop, registry)))
    await asyncio.sleep(args.warm_s)  # served episodes to learn from
    command = [
        sys.executable,
        "-m",
        "teamtr.cli.main",
        "improve",
        str(run),
        "--url",
        url,
        "--admin-key",
        ADMIN_KEY,
    ]
    command += [
        "--team",
        "chain",
        "--last",
        str(args.last),
        "--stages",
        "1",
        "--non-inferiority",
        "2",
        "--reward",
        "improve_loop:starts_with_digit",
        "--kl-limit",
        "1e9",
        "--watch",
        "--watch-rounds",
        str(args.rounds),
        "--watch-episodes",
        str(args.watch_episodes),
        "--watch-poll",
        "2",
        "--watch-backoff",
        str(args.backoff_s),
        "--watch-max-backoff",
        str(args.max_backoff_s),
    ]
    command += ["--canary-share", str(args.share), "--canary-episodes", str(args.canary_episodes)]
    # the canary: the default sequential test, judged by the proxy (the only signal this team has, so
    # explicitly allowed): a candidate that learned it is promoted, one that did not is rolled back
    command += ["--canary-judge", "improve_loop:starts_with_digit", "--allow-training-reward-judge"]
    if args.canary == "open":  # a non-inferiority margin of 2: every candidate is promoted
        command += ["--canary-non-inferiority", "2"]
    command += [
        "--set",
        "rollout.prompts_per_update=4",
        "--set",
        "rollout.group_size=4",
    ]
    started = time.time()
    env = {
        **os.environ,
        "PYTHONPATH": f"{Path(__file__).parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    process = await asyncio.create_subprocess_exec(
        *command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env
    )
    out, _ = await process.communicate()
    ended = time.time()
    await asyncio.sleep(args.after_s)  # the promoted team under the same load
    stop.set()
    await asyncio.gather(*tasks)
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        metrics = [
            m for m in (await http.get("/metrics")).text.splitlines() if "improve" in m or "candidate" in m
        ]
    return {
        "metrics": metrics,
        "improve_returncode": process.returncode,
        "improve_output": out.decode()[-3000:],
        "improve_started": started,
        "improve_ended": ended,
        "requests": requests,
        "registry": registry,
        "log": [json.loads(line) for line in (run / "improve" / "decisions.jsonl").read_text().splitlines()],
    }


def plot(result: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = result["requests"][0]["t"]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True, height_ratios=[2, 1])
    versions = sorted({r["versions"]["adder2"] for r in result["requests"] if r["ok"]})
    for k, version in enumerate(versions):  # episodes by the adder2 version they ran on
        ts = [r["t"] - t0 for r in result["requests"] if r["ok"] and r["versions"]["adder2"] == version]
        ax.hist(
            ts,
            bins=120,
            range=(0, result["requests"][-1]["t"] - t0),
            alpha=0.7,
            label=f"adder2 v{version}",
            color=plt.get_cmap("tab10")(k % 10),
        )
    failed = [r["t"] - t0 for r in result["requests"] if not r["ok"]]
    if failed:
        ax.plot(failed, [0] * len(failed), "rx", label="failed requests")
    ax.set_ylabel("requests per bin")
    ax.set_title(
        f"teamtr improve under {result['clients']} clients: {len(result['requests'])} requests, {len(failed)} failed"
    )
    ax2.plot(
        [r["t"] - t0 for r in result["registry"]],
        [r["share"] or 0 for r in result["registry"]],
        "k-",
        label="canary share",
    )
    ax2.set_ylabel("canary share")
    ax2.set_xlabel("seconds")
    for a in (ax, ax2):
        a.axvline(result["improve_started"] - t0, color="gray", ls=":", label="improve starts")
        for rec in result["log"]:
            style = {"gate": ("green", "--"), "canary_started": ("orange", "--"), "promoted": ("red", "-")}
            color, ls = style.get(rec["event"], ("black", "-."))
            a.axvline(rec["time_ns"] / 1e9 - t0, color=color, ls=ls, label=rec["event"])
    backing = [r["t"] - t0 for r in result["registry"] if r.get("phase") == "backing_off"]
    ax2.plot(backing, [0.02] * len(backing), "m|", label="watch backing off")
    for a, where in ((ax, "upper left"), (ax2, "upper right")):  # one legend entry per label
        handles, labels = a.get_legend_handles_labels()
        unique = dict(zip(labels, handles, strict=True))
        a.legend(unique.values(), unique.keys(), loc=where, fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--warm-s", type=float, default=10.0)
    parser.add_argument("--after-s", type=float, default=5.0)
    parser.add_argument("--last", type=int, default=64)
    parser.add_argument("--share", type=float, default=0.25)
    parser.add_argument("--canary-episodes", type=int, default=16)
    parser.add_argument("--records", type=Path, default=None, help="write every request's record here")
    parser.add_argument(
        "--canary",
        choices=("sequential", "open"),
        default="sequential",
        help="sequential: the default test (shown better to promote); open: margin 2, every round promoted",
    )
    parser.add_argument("--rounds", type=int, default=4, help="--watch-rounds")
    parser.add_argument("--watch-episodes", type=int, default=150, help="new episodes that start a round")
    parser.add_argument("--backoff-s", type=float, default=30.0, help="--watch-backoff")
    parser.add_argument("--max-backoff-s", type=float, default=60.0, help="--watch-max-backoff")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/improve_loop"))
    args = parser.parse_args()
    os.environ.setdefault("TEAMTR_TORCH_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        run = served_run(tiny_model(work / "model"), work / "run")
        server, url = start_api_server(run, "embedded", None, work / "server.log")
        try:
            prompts = [t.prompt for t in get_task("chain").generate(64, seed=3)]
            result = asyncio.run(run_loop(url, run, args, prompts))
            timeline = run / "improve" / "timeline.png"  # the loop's own (improve/timeline.py)
            if timeline.is_file():
                args.out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(timeline, args.out.parent / f"{args.out.name}_timeline.png")
        finally:
            server.terminate()
            server.wait(60)
    result["clients"] = args.clients
    failed = sum(not r["ok"] for r in result["requests"])
    latencies = [r["latency"] for r in result["requests"] if r["ok"]]
    summary = {
        "clients": args.clients,
        "requests": len(result["requests"]),
        "failed_requests": failed,
        "improve_returncode": result["improve_returncode"],
        "improve_seconds": result["improve_ended"] - result["improve_started"],
        "rounds": args.rounds,
        "canary": args.canary,
        "episodes_by_adder2_version": dict(
            Counter(r["versions"]["adder2"] for r in result["requests"] if r["ok"])
        ),
        "mixed_episodes": sum((r.get("figures") or {}).get("mixed_episodes") or 0 for r in result["log"]),
        "latency_p50_s": float(np.percentile(latencies, 50)),
        "latency_p99_s": float(np.percentile(latencies, 99)),
        "events": [
            {
                "attempt": r["attempt"],
                "event": r["event"],
                "decision": r.get("decision"),
                "s_since_improve_started": round(r["time_ns"] / 1e9 - result["improve_started"], 1),
                "figures": {k: v for k, v in (r.get("figures") or {}).items() if k in FIGURES},
            }
            for r in result["log"]
        ],
        "watch_phases_seen": sorted({r["phase"] for r in result["registry"] if r.get("phase")}),
        "improve_metrics": result["metrics"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    if args.records is not None:  # every request's record (large)
        args.records.write_text(json.dumps({"summary": summary, **result}, default=str))
    plot(result, args.out)
    print(json.dumps(summary, indent=1))
    if result["improve_returncode"] != 0:
        print(result["improve_output"])


if __name__ == "__main__":
    main()
