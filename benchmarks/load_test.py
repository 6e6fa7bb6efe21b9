"""Load test of the team chat API while adapters are hot-swapped, with the API's overhead measured in the run.

    .venv/bin/python benchmarks/load_test.py --engine both      # embedded, then vllm (launched here)
    .venv/bin/python benchmarks/load_test.py --engine embedded --requests 128 --rounds 3 --clients 32 --swaps 5
    .venv/bin/python benchmarks/load_test.py --model smollm2 --engine vllm --adapter-scale 0.02 \
        --requests 32 --rounds 1 --clients 8 --swaps 2       # a real chat model (docs/models.md)

For each engine, on the same model, adapters and tasks, `--rounds` interleaved rounds of:
1. direct: `--clients` concurrent workers run the team in process (registry pins + `Team.arun`): the
   floor the API adds to;
2. api: a real `teamtr serve` subprocess (uvicorn, tracing to its SQLite store on, as by default) and
   `--clients` concurrent HTTP clients;
each round sends `--requests` requests while a new version of every role's adapter is promoted `--swaps`
times (through POST /admin/adapters for the api); then, per round, `--single-requests` requests from one
client, direct and api (no batching, no queueing). Then a second server, whose admission queue holds
`--queue-bound` episodes, measures unloaded latency (one client), time to the first streamed content
delta against that, and 4x `--queue-bound` clients sending `--overload-requests` requests (every
answer must be 200 or 429). Prints p50 / p99 latency, throughput, failed requests (must be 0) and the
API / direct ratios, and writes them as JSON. Everything is on 127.0.0.1; request count and time are
bounded (--timeout-s per round).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import torch
import yaml
from rich.console import Console
from rich.table import Table

from teamtr.engines.models import resolve_model
from teamtr.engines.random_adapters import write_versions
from teamtr.engines.vllm_server import free_port
from teamtr.graphs.run_layout import version_dirs
from teamtr.serving.server import ServeConfig, build_server
from teamtr.tasks import get_task

ROLES = ("adder1", "adder2", "adder3")
ROLES_FACTORY = "teamtr.graphs.chain_team:chain_roles"
ADMIN_KEY = "load-test-admin"
API_VERSION_BASE = 1001
console = Console(width=150)


@dataclass
class Phase:
    name: str
    latencies_s: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    swaps_done: int = 0
    versions_seen: set[int] = field(default_factory=set)

    def summary(self) -> dict:
        lat = sorted(self.latencies_s)
        q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) > 1 else lat * 99
        return {
            "requests": len(lat) + len(self.failures),
            "failed": len(self.failures),
            "p50_ms": 1000 * q[49],
            "p99_ms": 1000 * q[98],
            "mean_ms": 1000 * statistics.fmean(lat),
            "throughput_rps": len(lat) / self.wall_s,
            "wall_s": self.wall_s,
            "swaps": self.swaps_done,
            "adapter_versions_seen": sorted(self.versions_seen),
        }


def tiny_model(out: Path) -> Path:
    from teamtr.training.warmstart import tiny_random_model

    return Path(tiny_random_model(out, seed=0))


def prepare(
    work: Path, model_dir: Path, first: int, pending_versions: int, scale: float = 0.3
) -> tuple[Path, Path]:
    """A run directory holding v<first> of every role (served at start) and the versions to push next."""
    run, pending = work / "run", work / "pending"
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.yaml").write_text(
        yaml.safe_dump({"team": {"roles": ROLES_FACTORY, "model": str(model_dir)}})
    )
    write_versions(model_dir, run, range(first, first + 1), ROLES, scale=scale)
    write_versions(model_dir, pending, range(first + 1, first + 1 + pending_versions), ROLES, scale=scale)
    return run, pending


def swap_points(requests: int, swaps: int) -> list[int]:
    """Promote after these many completed requests: spread evenly through the run."""
    return [requests * (k + 1) // (swaps + 1) for k in range(swaps)]


# ---- direct: the team in process ---------------------------------------------------------------------


async def direct_round(
    server, tasks: list[str], clients: int, pushes: list[list[tuple[str, int, Path]]]
) -> Phase:
    """`clients` workers run the team in process; `pushes[k]` is promoted after (k+1)/(len+1) of the tasks."""
    served = server.teams["chain"]
    phase, done, queue = Phase("direct"), [0], list(tasks)
    points = swap_points(len(tasks), len(pushes))

    async def worker() -> None:
        while queue:
            task = queue.pop()
            t0 = time.perf_counter()
            try:
                async with server.registry.pin(sorted(served.adapters.values())) as pinned:
                    pins = {role: pinned[a] for role, a in served.adapters.items()}
                    traj = await served.team.arun(task, adapter_pins=pins)
                phase.latencies_s.append(time.perf_counter() - t0)
                phase.versions_seen.update(t.adapter_version for t in traj.turns)
            except Exception as e:  # counted, not hidden
                phase.failures.append(f"{type(e).__name__}: {e}")
            done[0] += 1

    async def swapper() -> None:
        for point, swap in zip(points, pushes, strict=True):
            while done[0] < point:
                await asyncio.sleep(0.005)
            for role, version, path in swap:
                await server.registry.push(role, path, version)
            phase.swaps_done += 1

    t0 = time.perf_counter()
    await asyncio.gather(swapper(), *(worker() for _ in range(clients)))
    phase.wall_s = time.perf_counter() - t0
    return phase


# ---- api: a real server subprocess --------------------------------------------------------------------


def start_api_server(
    run: Path, engine: str, vllm_url: str | None, log: Path, queue: tuple[int, int] | None = None
) -> tuple[subprocess.Popen, str]:
    """`teamtr serve` on the run directory; `queue` = (max_in_flight, max_waiting) serves it through a
    config file with that admission queue instead."""
    port = free_port()
    source = str(run)
    if queue is not None:
        source = str(log.with_suffix(".yaml"))
        team = {"run_dir": str(run.resolve()), "max_in_flight": queue[0], "max_waiting": queue[1]}
        model = yaml.safe_load((run / "config.yaml").read_text())["team"]["model"]
        Path(source).write_text(yaml.safe_dump({"model": model, "teams": {"chain": team}}))
    cmd = [
        sys.executable,
        "-m",
        "teamtr.cli.main",
        "serve",
        source,
        *(["--team-name", "chain"] if queue is None else []),
        "--port",
        str(port),
        "--admin-key",
        ADMIN_KEY,
        "--engine",
        engine,
    ]
    if vllm_url:
        cmd += ["--vllm-url", vllm_url]
    env = {**os.environ, "TEAMTR_TORCH_THREADS": os.environ.get("TEAMTR_TORCH_THREADS", "1")}
    process = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    process.kill()
    raise RuntimeError("server did not become healthy")


async def api_round(
    http: httpx.AsyncClient,
    tasks: list[str],
    clients: int,
    pushes: list[list[tuple[str, int, Path]]],
    on_answer: Callable[[dict], None] | None = None,
    after_swaps: Callable[[Phase], Awaitable[None]] | None = None,
) -> Phase:
    """`clients` concurrent HTTP clients; `pushes` promoted through POST /admin/adapters during the round.
    `on_answer` gets every 200 answer's body; `after_swaps` runs once the last push is done
    (benchmarks/replicas_load.py: a rollback)."""
    phase, done, queue = Phase("api"), [0], list(tasks)
    points = swap_points(len(tasks), len(pushes))

    async def worker() -> None:
        while queue:
            task = queue.pop()
            t0 = time.perf_counter()
            try:
                r = await http.post(
                    "/v1/chat/completions",
                    json={"model": "chain", "messages": [{"role": "user", "content": task}]},
                )
                if r.status_code != 200:
                    phase.failures.append(f"{r.status_code}: {r.text[:200]}")
                else:
                    phase.latencies_s.append(time.perf_counter() - t0)
                    phase.versions_seen.update(r.json()["teamtr"]["adapter_versions"].values())
                    if on_answer is not None:
                        on_answer(r.json())
            except httpx.HTTPError as e:
                phase.failures.append(f"{type(e).__name__}: {e}")
            done[0] += 1

    async def swapper() -> None:
        for point, swap in zip(points, pushes, strict=True):
            while done[0] < point:
                await asyncio.sleep(0.005)
            for role, version, path in swap:
                r = await http.post(
                    "/admin/adapters",
                    json={"role": role, "path": str(path), "version": version},
                    headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                )
                if r.status_code != 200:
                    phase.failures.append(f"swap {role} v{version}: {r.status_code} {r.text[:200]}")
            phase.swaps_done += 1
        if after_swaps is not None:
            await after_swaps(phase)

    t0 = time.perf_counter()
    await asyncio.gather(swapper(), *(worker() for _ in range(clients)))
    phase.wall_s = time.perf_counter() - t0
    return phase


# ---- one client, streaming, overload ----------------------------------------------------------------


async def one_client_round(run_one: Callable[[str], Awaitable[None]], tasks: list[str], name: str) -> Phase:
    """The tasks one after another: latency without batching or queueing."""
    phase = Phase(name)
    t0 = time.perf_counter()
    for task in tasks:
        t = time.perf_counter()
        try:
            await run_one(task)
            phase.latencies_s.append(time.perf_counter() - t)
        except Exception as e:  # counted, not hidden
            phase.failures.append(f"{type(e).__name__}: {e}")
    phase.wall_s = time.perf_counter() - t0
    return phase


def chat_body(task: str, **extra: object) -> dict:
    return {"model": "chain", "messages": [{"role": "user", "content": task}], **extra}


async def streamed_first_content(http: httpx.AsyncClient, task: str) -> tuple[float, float]:
    """(time to the first content delta, time to [DONE]) of one streamed request, in seconds."""
    t0, first = time.perf_counter(), None
    async with http.stream("POST", "/v1/chat/completions", json=chat_body(task, stream=True)) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if first is None and line.startswith("data: {"):
                choices = json.loads(line[6:]).get("choices") or [{}]
                if (choices[0].get("delta") or {}).get("content"):
                    first = time.perf_counter() - t0
    return (first if first is not None else float("nan")), time.perf_counter() - t0


async def streaming_and_overload(
    http: httpx.AsyncClient, tasks: list[str], queue_bound: int, overload_requests: int
) -> dict:
    """On a server whose admission queue holds `queue_bound` episodes: unloaded latency (one client, not
    streamed), time to first content (one client, streamed), then 4x `queue_bound` clients."""

    async def plain(task: str) -> None:
        (await http.post("/v1/chat/completions", json=chat_body(task))).raise_for_status()

    unloaded = (await one_client_round(plain, tasks, "unloaded")).summary()
    firsts, fulls = [], []
    for task in tasks:
        first, full = await streamed_first_content(http, task)
        firsts.append(first)
        fulls.append(full)
    statuses: dict[int, int] = {}
    admitted: list[float] = []
    no_answer: list[str] = []
    queue = [tasks[i % len(tasks)] for i in range(overload_requests)]

    async def client() -> None:
        while queue:
            task = queue.pop()
            t0 = time.perf_counter()
            try:
                r = await http.post("/v1/chat/completions", json=chat_body(task))
                code = r.status_code
            except httpx.HTTPError as e:
                code = -1  # no HTTP answer at all (counted with the 5xx)
                no_answer.append(f"{type(e).__name__}: {e}")
            statuses[code] = statuses.get(code, 0) + 1
            if code == 200:
                admitted.append(time.perf_counter() - t0)
            elif code == 429:  # try again after Retry-After, as OpenAI's clients do
                queue.append(task)
                await asyncio.sleep(float(r.headers.get("Retry-After", 1)))

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(4 * queue_bound)))
    wall = time.perf_counter() - t0
    q = lambda xs, k: 1000 * statistics.quantiles(sorted(xs), n=100, method="inclusive")[k]  # noqa: E731
    empty = sum(math.isnan(f) for f in firsts)  # answers with no content (random adapters): no first delta
    firsts = [f for f in firsts if not math.isnan(f)] or [float("nan")] * 2
    return {
        "unloaded": unloaded,
        "streamed_without_content": empty,
        "ttft_p50_ms": q(firsts, 49),
        "ttft_p99_ms": q(firsts, 98),
        "streamed_full_p50_ms": q(fulls, 49),
        "ttft_over_unstreamed_p50": q(firsts, 49) / unloaded["p50_ms"],
        "overload": {
            "clients": 4 * queue_bound,
            "queue_bound": queue_bound,
            "statuses": {str(k): v for k, v in sorted(statuses.items())},
            "errors_5xx_or_none": sum(v for k, v in statuses.items() if k >= 500 or k < 0),
            "other_statuses": sum(v for k, v in statuses.items() if k not in (200, 429) and 0 <= k < 500),
            "no_answer_errors": no_answer[:5],
            "admitted_p50_ms": q(admitted, 49),
            "admitted_p99_ms": q(admitted, 98),
            "admitted_p99_over_unloaded_p99": q(admitted, 98) / unloaded["p99_ms"],
            "throughput_rps": len(admitted) / wall,
        },
    }


# ---- one engine ---------------------------------------------------------------------------------------


def push_plan(pending: Path, first: int, rounds: int, swaps: int) -> list[list[list[tuple[str, int, Path]]]]:
    """plan[round][swap] = [(role, version, dir)] promoting one new version of every role."""
    dirs = {role: dict(version_dirs(pending, role)) for role in ROLES}
    versions = iter(range(first, first + rounds * swaps))
    plan = []
    for _ in range(rounds):
        round_swaps = []
        for _ in range(swaps):
            v = next(versions)
            round_swaps.append([(role, v, dirs[role][v]) for role in ROLES])
        plan.append(round_swaps)
    return plan


def merge(phases: list[Phase], name: str) -> Phase:
    out = Phase(name)
    for p in phases:
        out.latencies_s += p.latencies_s
        out.failures += p.failures
        out.wall_s += p.wall_s
        out.swaps_done += p.swaps_done
        out.versions_seen |= p.versions_seen
    return out


async def bench_engine_async(
    engine: str, model_dir: Path, work: Path, args: argparse.Namespace, vllm_url: str | None
) -> dict:
    # direct serves versions 1.., the api server 1001..: distinct engine names on a shared vLLM server
    n_versions = args.rounds * args.swaps
    scale = args.adapter_scale
    run_d, pending_d = prepare(work / f"{engine}-direct", model_dir, 1, n_versions, scale)
    run_a, pending_a = prepare(work / f"{engine}-api", model_dir, API_VERSION_BASE, n_versions, scale)
    plan_d, plan_a = (
        push_plan(pending_d, 2, args.rounds, args.swaps),
        push_plan(pending_a, API_VERSION_BASE + 1, args.rounds, args.swaps),
    )
    config = ServeConfig.from_run_dir(
        run_d, "chain", engine=engine, vllm_url=vllm_url, tracing={"sqlite_path": None}
    )
    direct_server = await build_server(config)
    process, url = start_api_server(run_a, engine, vllm_url, work / f"{engine}-server.log")
    limits = httpx.Limits(max_connections=args.clients + 2, max_keepalive_connections=args.clients + 2)
    directs, apis, directs_1, apis_1 = [], [], [], []
    served = direct_server.teams["chain"]

    async def direct_one(task: str) -> None:
        async with direct_server.registry.pin(sorted(served.adapters.values())) as pinned:
            await served.team.arun(
                task, adapter_pins={role: pinned[a] for role, a in served.adapters.items()}
            )

    try:
        async with httpx.AsyncClient(base_url=url, timeout=args.timeout_s, limits=limits) as http:
            warm = "1+2+3+4"
            (
                await http.post(
                    "/v1/chat/completions",
                    json={"model": "chain", "messages": [{"role": "user", "content": warm}]},
                )
            ).raise_for_status()
            await direct_round(direct_server, [warm], 1, [])
            for k in range(args.rounds):  # interleaved, so drifting machine load hits both alike
                tasks = [t.prompt for t in get_task("chain").generate(args.requests, seed=args.seed + k)]
                console.print(
                    f"{engine}: round {k + 1}/{args.rounds}: {args.requests} requests, "
                    f"{args.clients} clients, {args.swaps} swaps, direct then api"
                )
                directs.append(
                    await asyncio.wait_for(
                        direct_round(direct_server, tasks, args.clients, plan_d[k]), args.timeout_s
                    )
                )
                apis.append(
                    await asyncio.wait_for(api_round(http, tasks, args.clients, plan_a[k]), args.timeout_s)
                )
                if args.single_requests:  # one client: no batching, no queueing
                    few = tasks[: args.single_requests]

                    async def api_one(task: str) -> None:
                        (await http.post("/v1/chat/completions", json=chat_body(task))).raise_for_status()

                    directs_1.append(await one_client_round(direct_one, few, "direct-1"))
                    apis_1.append(await one_client_round(api_one, few, "api-1"))
    finally:
        process.terminate()
        process.wait(60)
        await direct_server.aclose()
    probes = None
    if args.overload_requests:  # a second server with a small admission queue
        bound = args.queue_bound
        run_o, _ = prepare(work / f"{engine}-overload", model_dir, 2 * API_VERSION_BASE, 0, scale)
        process, url = start_api_server(
            run_o, engine, vllm_url, work / f"{engine}-overload.log", queue=(bound // 2, bound - bound // 2)
        )
        limits = httpx.Limits(max_connections=4 * bound + 2, max_keepalive_connections=4 * bound + 2)
        try:
            async with httpx.AsyncClient(base_url=url, timeout=args.timeout_s, limits=limits) as http:
                few = [t.prompt for t in get_task("chain").generate(args.single_requests or 24, seed=99)]
                (await http.post("/v1/chat/completions", json=chat_body(few[0]))).raise_for_status()  # warm
                probes = await streaming_and_overload(http, few, bound, args.overload_requests)
        finally:
            process.terminate()
            process.wait(60)
    if not directs:  # --rounds 0: the probes only
        return {"engine": engine, "streaming_and_overload": probes}
    direct, api = merge(directs, "direct"), merge(apis, "api")
    d, a = direct.summary(), api.summary()
    per_round = [x.summary()["mean_ms"] / y.summary()["mean_ms"] for x, y in zip(apis, directs, strict=True)]
    return {
        "engine": engine,
        "direct": d,
        "api": a,
        "overhead": {
            "p50_ratio": a["p50_ms"] / d["p50_ms"],
            "p99_ratio": a["p99_ms"] / d["p99_ms"],
            "mean_latency_ratio": a["mean_ms"] / d["mean_ms"],
            "throughput_ratio": a["throughput_rps"] / d["throughput_rps"],
            "mean_latency_ratio_per_round": per_round,
        },
        "one_client": one_client_summary(directs_1, apis_1),
        "streaming_and_overload": probes,
        "api_failures": api.failures[:10],
        "direct_failures": direct.failures[:10],
    }


def one_client_summary(directs: list[Phase], apis: list[Phase]) -> dict | None:
    if not directs:
        return None
    d, a = merge(directs, "direct-1").summary(), merge(apis, "api-1").summary()
    return {
        "direct": d,
        "api": a,
        "p50_ratio": a["p50_ms"] / d["p50_ms"],
        "p99_ratio": a["p99_ms"] / d["p99_ms"],
    }


def bench_engine(engine: str, model_dir: Path, work: Path, args: argparse.Namespace) -> dict:
    vllm, vllm_url = None, args.vllm_url
    if engine == "vllm" and not vllm_url:
        from teamtr.engines.open import EngineSpec, VLLMSpec, open_engine

        console.print("starting a vLLM server (~30-60 s on CPU)...")
        # --max-model-len: a real model's own (8192 for SmolLM2) would size the KV cache for nothing
        vllm = open_engine(
            EngineSpec(bases={"base": str(model_dir)}, kind="vllm", vllm=VLLMSpec(args=("--max-model-len", "2048")))
        )
        vllm_url = vllm.servers[0].url
    try:
        return asyncio.run(bench_engine_async(engine, model_dir, work, args, vllm_url))
    finally:
        if vllm is not None:
            vllm.close()


def print_results(results: list[dict]) -> None:
    table = Table(
        "engine", "phase", "requests", "failed", "swaps", "p50 ms", "p99 ms", "req/s", "versions seen"
    )
    for r in results:
        if "direct" not in r:
            continue
        for phase in ("direct", "api"):
            s = r[phase]
            table.add_row(
                r["engine"],
                phase,
                str(s["requests"]),
                str(s["failed"]),
                str(s["swaps"]),
                f"{s['p50_ms']:.0f}",
                f"{s['p99_ms']:.0f}",
                f"{s['throughput_rps']:.2f}",
                ",".join(map(str, s["adapter_versions_seen"])),
            )
    console.print(table)
    for r in results:
        o = r.get("overhead")
        if o:
            console.print(
                f"{r['engine']}: API / direct: p50 x{o['p50_ratio']:.2f}, p99 x{o['p99_ratio']:.2f}, "
                f"mean latency x{o['mean_latency_ratio']:.2f}, throughput x{o['throughput_ratio']:.2f}"
            )
        if r.get("one_client"):
            one = r["one_client"]
            console.print(
                f"{r['engine']}: one client: direct p50 {one['direct']['p50_ms']:.0f} ms, api p50 "
                f"{one['api']['p50_ms']:.0f} ms: API / direct p50 x{one['p50_ratio']:.2f}, p99 x{one['p99_ratio']:.2f}"
            )
        if r["streaming_and_overload"]:
            s, o = r["streaming_and_overload"], r["streaming_and_overload"]["overload"]
            console.print(
                f"{r['engine']}: unloaded p50 {s['unloaded']['p50_ms']:.0f} ms, p99 {s['unloaded']['p99_ms']:.0f} ms; "
                f"streamed: first content p50 {s['ttft_p50_ms']:.0f} ms (x{s['ttft_over_unstreamed_p50']:.2f} of "
                f"the unstreamed p50), done p50 {s['streamed_full_p50_ms']:.0f} ms"
            )
            console.print(
                f"{r['engine']}: overload ({o['clients']} clients, queue bound {o['queue_bound']}): statuses "
                f"{o['statuses']}, 5xx/no answer {o['errors_5xx_or_none']}; admitted p99 {o['admitted_p99_ms']:.0f} ms "
                f"= x{o['admitted_p99_over_unloaded_p99']:.2f} of the unloaded p99"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engine", choices=["embedded", "vllm", "both"], default="embedded")
    p.add_argument("--requests", type=int, default=128, help="requests per phase per round")
    p.add_argument("--rounds", type=int, default=3, help="direct / api rounds, interleaved")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--swaps", type=int, default=5, help="hot-swaps (a new version of every role) per round")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--model",
        default=None,
        help="base model: a folder, a .gguf or a shipped name such as smollm2 (default: a tiny random Llama)",
    )
    p.add_argument("--adapter-scale", type=float, default=0.3, help="std of the random LoRA B matrices")
    p.add_argument("--vllm-url", default=None, help="attach to this vLLM server (it must serve --model)")
    p.add_argument("--timeout-s", type=float, default=600.0, help="bound on each round of each phase")
    p.add_argument("--single-requests", type=int, default=24, help="one-client requests per round (0: none)")
    p.add_argument("--queue-bound", type=int, default=8, help="overload server: max_in_flight + max_waiting")
    p.add_argument(
        "--overload-requests", type=int, default=256, help="answered requests under 4x overload (0: skip)"
    )
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/load_test.json"))
    args = p.parse_args()
    torch.set_num_threads(int(os.environ.get("TEAMTR_TORCH_THREADS", "1")))
    work = Path(tempfile.mkdtemp(prefix="teamtr-load-"))
    model_dir = Path(resolve_model(args.model).path) if args.model else tiny_model(work / "model")
    engines = ["embedded", "vllm"] if args.engine == "both" else [args.engine]
    results = [bench_engine(e, model_dir, work, args) for e in engines]
    print_results(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"args": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=2, default=list
        )
    )
    console.print(f"results -> {args.out}")
    overloaded = [r["streaming_and_overload"] for r in results if r["streaming_and_overload"]]
    if any(p["overload"]["errors_5xx_or_none"] or p["overload"]["other_statuses"] for p in overloaded):
        sys.exit(1)
    if any(r["api"]["failed"] or r["direct"]["failed"] for r in results if "api" in r):
        sys.exit(1)


if __name__ == "__main__":
    main()
