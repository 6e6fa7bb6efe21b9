"""`teamtr improve` under load: 32 concurrent clients keep the served team busy while the improve loop
trains, gates, canaries and promotes; every request, the canary share and the versions served are
recorded on one timeline, plotted to a PNG (docs/improve.md), and failed requests are counted (must be 0).

    nice -n 5 .venv/bin/python benchmarks/improve_loop.py --clients 32 --out benchmarks/results/improve_loop

The team is the chain demo team on a tiny random model (benchmarks/load_test.py's setup and server), so
the figure shows the loop's mechanics under traffic, not a reward gain: the gate's and canary's
margins are opened so the promotion runs to the end. Pieces of benchmarks/load_test.py are reused.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from load_test import ADMIN_KEY, ROLES, ROLES_FACTORY, start_api_server, tiny_model  # noqa: E402

from teamtr.evals.tasks import get_task  # noqa: E402
from teamtr.serving.embedded import EmbeddedEngine, LoraSettings  # noqa: E402


def served_run(model_dir: Path, run: Path) -> Path:
    """v1 of every role; adder2's is a damaged (random) version."""
    run.mkdir(parents=True, exist_ok=True)
    team = {"roles": ROLES_FACTORY, "model": str(model_dir), "lora_rank": 4, "lora_alpha": 8}
    (run / "config.yaml").write_text(yaml.safe_dump({"task": {"name": "chain"}, "team": team}))
    engine = EmbeddedEngine(
        model_dir, adapters={r: None for r in ROLES}, threads=1, lora=LoraSettings(r=4, alpha=8)
    )
    torch.manual_seed(7)
    with torch.no_grad():
        for name, p in engine.adapter_parameters("adder2").items():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    for r in ROLES:
        engine.save_adapter(r, run / "adapters" / r / "v1")
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
    async with httpx.AsyncClient(
        base_url=url, timeout=60, headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    ) as http:
        while not stop.is_set():
            listed = (await http.get("/admin/adapters")).json()
            c = listed.get("candidate")
            log.append({"t": time.time(), "current": listed["current"], "share": c["share"] if c else None})
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
        "--margin",
        "1",
        "--kl-limit",
        "1e9",
    ]
    command += ["--canary-share", str(args.share), "--canary-episodes", str(args.canary_episodes)]
    command += [
        "--canary-margin",
        "1",
        "--set",
        "rollout.prompts_per_update=4",
        "--set",
        "rollout.group_size=4",
    ]
    started = time.time()
    process = await asyncio.create_subprocess_exec(*command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, _ = await process.communicate()
    ended = time.time()
    await asyncio.sleep(args.after_s)  # the promoted team under the same load
    stop.set()
    await asyncio.gather(*tasks)
    return {
        "improve_returncode": process.returncode,
        "improve_output": out.decode()[-3000:],
        "improve_started": started,
        "improve_ended": ended,
        "requests": requests,
        "registry": registry,
        "log": [json.loads(line) for line in (run / "improve" / "promotions.jsonl").read_text().splitlines()],
    }


def plot(result: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = result["requests"][0]["t"]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True, height_ratios=[2, 1])
    incumbent = min(result["registry"][0]["current"].values())
    for arm, color in (("incumbent", "tab:blue"), ("candidate", "tab:orange")):
        ts = [
            r["t"] - t0
            for r in result["requests"]
            if r["ok"] and (r["versions"]["adder2"] == incumbent) == (arm == "incumbent")
        ]
        ax.hist(
            ts,
            bins=60,
            range=(0, result["requests"][-1]["t"] - t0),
            alpha=0.7,
            label=f"{arm} episodes",
            color=color,
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
    ax.legend(loc="upper left", fontsize=8)
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
        finally:
            server.terminate()
            server.wait(60)
    result["clients"] = args.clients
    failed = sum(not r["ok"] for r in result["requests"])
    summary = {
        "clients": args.clients,
        "requests": len(result["requests"]),
        "failed_requests": failed,
        "improve_returncode": result["improve_returncode"],
        "improve_seconds": result["improve_ended"] - result["improve_started"],
        "decisions": [(r["event"], r.get("decision")) for r in result["log"]],
        "canary_episodes": sum(1 for r in result["requests"] if r["ok"] and r["versions"]["adder2"] != 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(
        json.dumps({"summary": summary, **result}, indent=1, default=str)
    )
    plot(result, args.out)
    print(json.dumps(summary, indent=1))
    if result["improve_returncode"] != 0:
        print(result["improve_output"])


if __name__ == "__main__":
    main()
