"""Overload on pooled keep-alive connections: 4x the admission bound of clients, each on one pooled
connection, honouring Retry-After, for a bounded time against a real `teamtr serve` on 127.0.0.1.

    .venv/bin/python benchmarks/overload_keepalive.py                     # 60 s, the server's keep-alive
    .venv/bin/python benchmarks/overload_keepalive.py --keep-alive-s 5    # uvicorn's default, to compare

Every answer must be 200 or 429 and no request may fail in transport (a reset, a broken pipe, a closed
connection): a client that waits out a Retry-After longer than the server's keep-alive sends its next
request on a connection the server is closing. Prints and writes (--out) the status counts, transport
errors by type and the Retry-After values seen. The model is the seconds-sized random tiny model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import yaml
from load_test import prepare, tiny_model

from teamtr.engines.vllm_server import free_port


async def client(url: str, deadline: float, statuses: Counter, errors: Counter, waits: list[float]) -> None:
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)  # one pooled connection
    body = {"model": "chain", "messages": [{"role": "user", "content": "1+2+3"}]}
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as http:
        while time.monotonic() < deadline:
            try:
                r = await http.post("/v1/chat/completions", json=body)
            except httpx.TransportError as e:
                errors[type(e).__name__] += 1
                await asyncio.sleep(0.1)
                continue
            statuses[r.status_code] += 1
            if r.status_code == 429:
                wait = float(r.headers["Retry-After"])
                waits.append(wait)
                await asyncio.sleep(wait)


async def overload(url: str, clients: int, seconds: float) -> dict:
    statuses: Counter = Counter()
    errors: Counter = Counter()
    waits: list[float] = []
    deadline = time.monotonic() + seconds
    await asyncio.gather(*(client(url, deadline, statuses, errors, waits) for _ in range(clients)))
    return {
        "requests": sum(statuses.values()) + sum(errors.values()),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "transport_errors": dict(errors),
        "retry_after_s": {
            "count": len(waits),
            "max": max(waits, default=0),
            "mean": sum(waits) / max(1, len(waits)),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--max-in-flight", type=int, default=2)
    parser.add_argument("--max-waiting", type=int, default=2)
    parser.add_argument(
        "--clients-per-place", type=int, default=4, help="clients = this x the admission bound"
    )
    parser.add_argument("--keep-alive-s", type=float, default=None, help="default: the ServeConfig default")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="overload-"))
    run, _ = prepare(work, tiny_model(work / "model"), 1, 0)
    team = {"run_dir": str(run), "max_in_flight": args.max_in_flight, "max_waiting": args.max_waiting}
    config: dict = {"teams": {"chain": team}}
    if args.keep_alive_s is not None:
        config["keep_alive_s"] = args.keep_alive_s
    (work / "serve.yaml").write_text(yaml.safe_dump(config))
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "teamtr.cli.main", "serve", str(work / "serve.yaml"), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            assert server.poll() is None and time.monotonic() < deadline, "teamtr serve did not start"
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
        clients = args.clients_per_place * (args.max_in_flight + args.max_waiting)
        result = asyncio.run(overload(url, clients, args.seconds))
    finally:
        server.terminate()
        server.wait(60)
    result.update(clients=clients, seconds=args.seconds, keep_alive_s=args.keep_alive_s or "default")
    print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    statuses_ok = set(result["statuses"]) <= {"200", "429"}
    sys.exit(0 if statuses_ok and not result["transport_errors"] else 1)


if __name__ == "__main__":
    main()
