"""Served throughput with 1 and 2 API replicas (a shared PostgreSQL store, HAProxy in front) beside the
same team run in process, while adapters are promoted through alternating replicas (issue 35).

    .venv/bin/python benchmarks/replicas_load.py                                  # 32 clients, 128 requests
    .venv/bin/python benchmarks/replicas_load.py --clients 32 --requests 128 --rounds 2 --swaps 6

Per round, on the same tasks: direct (benchmarks/load_test.py `direct_round`: the team in process, the
floor the API adds to), then 1 replica, then 2 replicas (`teamtr serve --db postgresql://...`, each its own
embedded engine, behind HAProxy configured by serving/haproxy.py), each sent `--requests` requests by
`--clients` concurrent clients while every role is promoted `--swaps` times through POST /admin/adapters on
the balancer (no conversation header: round-robin, so consecutive promotions go through alternating
replicas), and the last promotion is rolled back. A fresh database per configuration. With `--kill`, one of
the 2 replicas is SIGKILLed once half the requests are answered and started again. Checked from the span
store: every answered episode is in it once and ran on one version per role; answers other than 200 /
429 / 503 are counted (and failures: with `--kill`, the 503s of requests the balancer could not resend).
Prints and writes (benchmarks/results/replicas_load.json) p50 / p99 latency, throughput and the API /
direct ratios. PostgreSQL 15 and HAProxy as the tests start them (serving/local_replicas.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import httpx
from load_test import ADMIN_KEY, ROLES, Phase, api_round, direct_round, merge, prepare, push_plan, tiny_model
from rich.console import Console
from rich.table import Table

from teamtr.engines.vllm_server import free_port
from teamtr.serving.local_replicas import fresh_database, haproxy, postgres_server, start_serve, wait_healthy
from teamtr.serving.served_episodes import served_episodes
from teamtr.serving.server import ServeConfig, build_server
from teamtr.serving.tracing import trajectories_from_store
from teamtr.tasks import get_task

CHECKS = ("mixed_episodes", "answered_not_stored_once", "other_than_200_429_503", "answered_503")
RESULTS = Path(__file__).resolve().parent / "results" / "replicas_load.json"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
console = Console(width=150)


async def balanced_round(
    url: str,
    tasks: list[str],
    clients: int,
    pushes: list,
    timeout_s: float,
    midway: Callable[[], None] | None = None,
) -> tuple[Phase, list[str]]:
    """load_test's `api_round` through the balancer (its pushes go round-robin: through alternating
    replicas), the last push rolled back after it; `midway` runs (on a thread) once half the requests are
    answered. Returns the phase and the completion ids answered 200."""
    answered: list[str] = []
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)

    async def rollback(phase: Phase) -> None:  # through whichever replica the balancer picks
        for role in ROLES:
            r = await http.post("/admin/adapters/rollback", json={"role": role}, headers=ADMIN)
            if r.status_code != 200:
                phase.failures.append(f"rollback {role}: {r.status_code} {r.text[:200]}")

    async def halfway() -> None:
        if midway is not None:
            while len(answered) < len(tasks) // 2:
                await asyncio.sleep(0.005)
            await asyncio.to_thread(midway)

    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits) as http:
        phase, _ = await asyncio.gather(
            api_round(http, tasks, clients, pushes, lambda body: answered.append(body["id"]), rollback),
            halfway(),
        )
    return phase, answered


def mixed_episodes(db: str) -> int:
    """Answered episodes with a turn off the version its episode pinned for the turn's role."""
    pinned = {e.completion_id: e.adapter_versions for e in served_episodes(db)}
    return sum(
        any(t.adapter_version != pinned[t_id][t.role] for t in turns)
        for t_id, turns in ((t.task_id, t.turns) for t in trajectories_from_store(db))
        if t_id in pinned
    )


def replicas_round(
    n: int, run: Path, postgres: str, tasks: list[str], args: argparse.Namespace, pushes: list
) -> tuple[Phase, dict[str, int]]:
    """`n` replicas on a fresh database behind HAProxy (with `--kill` and 2 replicas, the first SIGKILLed
    halfway and started again): the round's phase, and its checks (mixed episodes, answered episodes
    not in the span store exactly once, answers other than 200 / 429 / 503)."""
    db = fresh_database(postgres, f"bench{uuid.uuid4().hex[:10]}")
    ports = [free_port() for _ in range(n)]
    serve_args = (str(run), "--team-name", "chain", "--db", db, "--admin-key", ADMIN_KEY)
    replicas = [start_serve(*serve_args, port=p) for p in ports]
    try:
        for process, port in zip(replicas, ports, strict=True):
            wait_healthy(process, f"http://127.0.0.1:{port}")
        with haproxy([f"127.0.0.1:{p}" for p in ports]) as url:
            warm = {"model": "chain", "messages": [{"role": "user", "content": "1+2+3+4"}]}
            for _ in range(2 * n):  # every replica once (round-robin), so none pays its first request here
                httpx.post(url + "/v1/chat/completions", json=warm, timeout=120).raise_for_status()
            def kill_and_restart() -> None:
                replicas[0].send_signal(signal.SIGKILL)
                replicas[0].wait(60)
                replicas[0] = start_serve(*serve_args, port=ports[0])
                wait_healthy(replicas[0], f"http://127.0.0.1:{ports[0]}")

            midway = kill_and_restart if args.kill and n > 1 else None
            phase, answered = asyncio.run(
                balanced_round(url, tasks, args.clients, pushes, args.timeout_s, midway)
            )
        phase.name = f"{n} replica" + ("s" if n > 1 else "")
        stored = Counter(e.completion_id for e in served_episodes(db))
        statuses = Counter(f.split(":")[0] for f in phase.failures if f[:1].isdigit())  # chat answers
        checks = {
            "mixed_episodes": mixed_episodes(db),
            "answered_not_stored_once": sum(stored[c] != 1 for c in answered),
            "other_than_200_429_503": sum(count for code, count in statuses.items() if code not in ("429", "503")),
            "answered_503": statuses.get("503", 0),
        }
        return phase, checks
    finally:
        for process in replicas:
            process.terminate()
            process.wait(60)


async def direct_phase(run: Path, tasks: list[str], clients: int, pushes: list) -> Phase:
    server = await build_server(ServeConfig.from_run_dir(run, "chain", tracing={"sqlite_path": None}))
    try:
        await direct_round(server, ["1+2+3+4"], 1, [])
        return await direct_round(server, tasks, clients, pushes)
    finally:
        await server.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--swaps", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=900)
    parser.add_argument("--kill", action="store_true", help="SIGKILL one of 2 replicas halfway, restart it")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="teamtr-replicas-"))
    model = tiny_model(work / "model")
    run, pending = prepare(work, model, 1, args.rounds * args.swaps)
    plan = push_plan(pending, 2, args.rounds, args.swaps)
    phases: dict[str, list[Phase]] = {"direct": [], "1 replica": [], "2 replicas": []}
    checks: dict[str, Counter[str]] = {"1 replica": Counter(), "2 replicas": Counter()}
    with ExitStack() as stack:
        postgres = stack.enter_context(postgres_server())
        for k in range(args.rounds):  # interleaved, so drifting machine load hits all alike
            tasks = [t.prompt for t in get_task("chain").generate(args.requests, seed=args.seed + k)]
            console.print(f"round {k + 1}/{args.rounds}: {args.requests} requests, {args.clients} clients")
            phases["direct"].append(asyncio.run(direct_phase(run, tasks, args.clients, plan[k])))
            for n in (1, 2):
                phase, found = replicas_round(n, run, postgres, tasks, args, plan[k])
                phases[phase.name].append(phase)
                checks[phase.name].update(found)
    summary = {name: merge(ps, name).summary() for name, ps in phases.items()}
    direct = summary["direct"]
    for name in ("1 replica", "2 replicas"):
        s = summary[name]
        s.update({check: checks[name][check] for check in CHECKS})
        s["throughput_vs_direct"] = s["throughput_rps"] / direct["throughput_rps"]
        s["p50_vs_direct"] = s["p50_ms"] / direct["p50_ms"]
    table = Table(
        "", "requests", "failed", "p50 ms", "p99 ms", "req/s", "x direct (req/s)", "x direct (p50)", "checks"
    )
    for name, s in summary.items():
        table.add_row(
            name,
            str(s["requests"]),
            str(s["failed"]),
            f"{s['p50_ms']:.0f}",
            f"{s['p99_ms']:.0f}",
            f"{s['throughput_rps']:.2f}",
            f"{s.get('throughput_vs_direct', 1.0):.2f}",
            f"{s.get('p50_vs_direct', 1.0):.2f}",
            ", ".join(f"{c} {s[c]}" for c in CHECKS if c in s),
        )
    console.print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    machine = {"cpus": os.cpu_count(), "platform": platform.platform()}
    record = {"args": {**vars(args), "out": str(args.out)}, "machine": machine, **summary}
    args.out.write_text(json.dumps(record, indent=2))
    console.print(f"written: {args.out}")


if __name__ == "__main__":
    main()
