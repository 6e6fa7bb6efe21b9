"""Load test of the team chat API while adapters are hot-swapped, with the API's overhead measured in the run.

    .venv/bin/python benchmarks/load_test.py --engine embedded          # or vllm, or both
    .venv/bin/python benchmarks/load_test.py --engine both --requests 256 --clients 32 --swaps 5

For each engine, in one run, on the same model, adapters and tasks:
1. direct: `--clients` concurrent workers run the team in process (registry pins + `Team.arun`), the
   floor the API adds to; `--swaps` new adapter versions are promoted during it, as in (2);
2. api: a real `teamtr serve` subprocess (uvicorn, tracing to its SQLite store on, as by default);
   `--clients` concurrent HTTP clients send `--requests` chat completions while a swapper promotes a new
   version of every role's adapter `--swaps` times through POST /admin/adapters.
Prints p50 / p99 latency, throughput, failed requests (must be 0) and the API / direct ratios, and writes
them as JSON. Everything is on 127.0.0.1; request count and time are bounded (--timeout-s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import torch
import yaml
from rich.console import Console
from rich.table import Table

from teamtr.evals.tasks import get_task
from teamtr.serving.cli import ServeConfig, build_server
from teamtr.serving.embedded import EmbeddedEngine, LoraSettings
from teamtr.serving.registry import version_dirs
from teamtr.serving.vllm_server import free_port

ROLES = ("adder1", "adder2", "adder3")
ROLES_FACTORY = "teamtr.graphs.chain_team:chain_roles"
ADMIN_KEY = "load-test-admin"
console = Console()


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


def write_adapter_versions(model_dir: Path, root: Path, versions: range, rank: int = 4) -> None:
    """root/adapters/<role>/v<k>/: peft LoRA directories with seeded random weights, one per version."""
    engine = EmbeddedEngine(
        model_dir,
        adapters={r: None for r in ROLES},
        threads=1,
        lora=LoraSettings(r=rank, alpha=2 * rank, target_modules=("q_proj", "v_proj")),
    )
    for k in versions:
        torch.manual_seed(1000 * k)
        with torch.no_grad():
            for r in ROLES:
                for name, p in engine.adapter_parameters(r).items():
                    if "lora_B" in name:
                        p.normal_(0, 0.3)
                engine.save_adapter(r, root / "adapters" / r / f"v{k}")


def tiny_model(out: Path) -> Path:
    from teamtr.training.warmstart import tiny_random_model

    return Path(tiny_random_model(out, seed=0))


def prepare(work: Path, model_dir: Path, swaps: int) -> tuple[Path, Path]:
    """A run directory holding v1 of every role (served at start) and a folder of v2..v{swaps+1} to push."""
    run, pending = work / "run", work / "pending"
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.yaml").write_text(
        yaml.safe_dump({"team": {"roles": ROLES_FACTORY, "model": str(model_dir)}})
    )
    write_adapter_versions(model_dir, run, range(1, 2))
    write_adapter_versions(model_dir, pending, range(2, swaps + 2))
    return run, pending


def swap_points(requests: int, swaps: int) -> list[int]:
    """Promote after these many completed requests: spread evenly through the run."""
    return [requests * (k + 1) // (swaps + 1) for k in range(swaps)]


# ---- direct: the team in process ---------------------------------------------------------------------


async def run_direct(config: ServeConfig, tasks: list[str], clients: int, swaps: int, pending: Path) -> Phase:
    server = await build_server(
        config.model_copy(update={"tracing": config.tracing.model_copy(update={"sqlite_path": None})})
    )
    served = server.teams["chain"]
    phase, done, queue = Phase("direct"), [0], list(enumerate(tasks))
    points = swap_points(len(tasks), swaps)
    await _warm_up_direct(served, server.registry)

    async def worker() -> None:
        while queue:
            i, task = queue.pop()
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
        for k, point in enumerate(points):
            while done[0] < point:
                await asyncio.sleep(0.005)
            for role in ROLES:
                version, path = version_dirs(pending, role)[k]
                await server.registry.push(role, path, version)
            phase.swaps_done += 1

    t0 = time.perf_counter()
    await asyncio.gather(swapper(), *(worker() for _ in range(clients)))
    phase.wall_s = time.perf_counter() - t0
    await server.aclose()
    return phase


async def _warm_up_direct(served, registry) -> None:
    async with registry.pin(sorted(served.adapters.values())) as pinned:
        await served.team.arun("1+2+3+4", adapter_pins={r: pinned[a] for r, a in served.adapters.items()})


# ---- api: a real server subprocess --------------------------------------------------------------------


def start_api_server(run: Path, engine: str, vllm_url: str | None, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "teamtr.graphs.cli",
        "serve",
        str(run),
        "--team-name",
        "chain",
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


async def run_api(
    url: str, tasks: list[str], clients: int, swaps: int, pending: Path, timeout_s: float
) -> Phase:
    phase, done, queue = Phase("api"), [0], list(enumerate(tasks))
    points = swap_points(len(tasks), swaps)
    limits = httpx.Limits(max_connections=clients + 2, max_keepalive_connections=clients + 2)
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits) as http:
        r = await http.post(
            "/v1/chat/completions",
            json={"model": "chain", "messages": [{"role": "user", "content": "1+2+3+4"}]},
        )  # warm-up
        r.raise_for_status()

        async def worker() -> None:
            while queue:
                i, task = queue.pop()
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
                except httpx.HTTPError as e:
                    phase.failures.append(f"{type(e).__name__}: {e}")
                done[0] += 1

        async def swapper() -> None:
            for k, point in enumerate(points):
                while done[0] < point:
                    await asyncio.sleep(0.005)
                for role in ROLES:
                    version, path = version_dirs(pending, role)[k]
                    r = await http.post(
                        "/admin/adapters",
                        json={"role": role, "path": str(path), "version": version},
                        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                    )
                    if r.status_code != 200:
                        phase.failures.append(f"swap {role} v{version}: {r.status_code} {r.text[:200]}")
                phase.swaps_done += 1

        t0 = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(swapper(), *(worker() for _ in range(clients))), timeout_s)
        phase.wall_s = time.perf_counter() - t0
    return phase


# ---- one engine ---------------------------------------------------------------------------------------


def bench_engine(engine: str, model_dir: Path, work: Path, args: argparse.Namespace) -> dict:
    run, pending = prepare(work / engine, model_dir, args.swaps)
    tasks = [t.prompt for t in get_task("chain").generate(args.requests, seed=args.seed)]
    vllm = None
    vllm_url = args.vllm_url
    if engine == "vllm" and not vllm_url:
        from teamtr.serving.vllm_server import start_vllm_server

        console.print("starting a vLLM server (~30-60 s on CPU)...")
        vllm = start_vllm_server(model_dir, max_loras=8)
        vllm_url = vllm.url
    try:
        config = ServeConfig.from_run_dir(run, "chain", engine=engine, vllm_url=vllm_url)
        console.print(
            f"[{engine}] direct: {args.requests} episodes, {args.clients} workers, {args.swaps} swaps"
        )
        direct = asyncio.run(run_direct(config, tasks, args.clients, args.swaps, pending))
        # the api phase promotes the same versions again on its own server: a fresh run directory
        run2, pending2 = prepare(work / f"{engine}-api", model_dir, args.swaps)
        process, url = start_api_server(run2, engine, vllm_url, work / f"{engine}-server.log")
        try:
            console.print(
                f"[{engine}] api: {args.requests} requests, {args.clients} clients, {args.swaps} swaps"
            )
            api = asyncio.run(run_api(url, tasks, args.clients, args.swaps, pending2, args.timeout_s))
        finally:
            process.terminate()
            process.wait(60)
    finally:
        if vllm is not None:
            vllm.stop()
    d, a = direct.summary(), api.summary()
    return {
        "engine": engine,
        "direct": d,
        "api": a,
        "overhead": {
            "p50_ratio": a["p50_ms"] / d["p50_ms"],
            "p99_ratio": a["p99_ms"] / d["p99_ms"],
            "mean_latency_ratio": a["mean_ms"] / d["mean_ms"],
            "throughput_ratio": a["throughput_rps"] / d["throughput_rps"],
        },
        "api_failures": api.failures[:10],
        "direct_failures": direct.failures[:10],
    }


def print_results(results: list[dict]) -> None:
    table = Table(
        "engine", "phase", "requests", "failed", "swaps", "p50 ms", "p99 ms", "req/s", "versions seen"
    )
    for r in results:
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
        o = r["overhead"]
        console.print(
            f"[{r['engine']}] API / direct: p50 x{o['p50_ratio']:.2f}, p99 x{o['p99_ratio']:.2f}, "
            f"mean latency x{o['mean_latency_ratio']:.2f}, throughput x{o['throughput_ratio']:.2f}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engine", choices=["embedded", "vllm", "both"], default="embedded")
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--swaps", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", type=Path, default=None, help="base model dir (default: a tiny random Llama)")
    p.add_argument("--vllm-url", default=None, help="attach to this vLLM server (it must serve --model)")
    p.add_argument("--timeout-s", type=float, default=900.0, help="bound on each phase")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/load_test.json"))
    args = p.parse_args()
    torch.set_num_threads(int(os.environ.get("TEAMTR_TORCH_THREADS", "1")))
    work = Path(tempfile.mkdtemp(prefix="teamtr-load-"))
    model_dir = args.model or tiny_model(work / "model")
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
    if any(r["api"]["failed"] or r["direct"]["failed"] for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
