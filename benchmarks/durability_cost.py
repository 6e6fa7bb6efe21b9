"""What answering only after an episode is durable costs: its spans written to the SQLite store as they
end (`SimpleSpanProcessor`) and its thread's seen-message digests committed before the answer, against
the batched way (`BatchSpanProcessor`, digests committed after the answer), on one server process.

    .venv/bin/python benchmarks/durability_cost.py --requests 40 --rounds 3 --out benchmarks/results/durability_cost.json

Each round sends `--requests` sequential requests (one client, each continuing its thread, so the
digests are written) in each mode, interleaved; and times, in the durable mode, the span exports and
the digest commits each request waits for. Prints p50 / mean latency per mode and the durable writes'
share. The model is the seconds-sized random tiny model; everything is in one process on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from load_test import prepare, tiny_model
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

import teamtr.serving.tracing as tracing
from teamtr.serving.background import BackgroundServer
from teamtr.serving.conversations import Conversations
from teamtr.serving.server import ServeConfig, build_server
from teamtr.serving.trace_store import SQLiteSpanExporter

WAITED: list[float] = []  # seconds the current request spent in durable writes


def timed_export(export: Callable[..., Any]) -> Callable[..., Any]:
    def run(self: SQLiteSpanExporter, spans: Any) -> Any:
        began = time.perf_counter()
        try:
            return export(self, spans)
        finally:
            WAITED.append(time.perf_counter() - began)

    return run


def timed_seen(add_seen: Callable[..., Any]) -> Callable[..., Any]:
    async def run(self: Conversations, *args: Any) -> None:
        began = time.perf_counter()
        await add_seen(self, *args)
        WAITED.append(time.perf_counter() - began)

    return run


def seen_after_the_answer(add_seen: Callable[..., Any]) -> Callable[..., Any]:
    async def run(self: Conversations, *args: Any) -> None:  # the batched way: not awaited
        asyncio.ensure_future(add_seen(self, *args))

    return run


def requests(url: str, n: int, prefix: str) -> tuple[list[float], list[float]]:
    """Latencies and, per request, the seconds it waited for durable writes."""
    latencies, waited = [], []
    history: list[dict[str, str]] = []
    with httpx.Client(base_url=url, timeout=120) as http:
        for k in range(n):
            if k % 4 == 0:
                history, thread = [], f"{prefix}-{k}"
            question = {"role": "user", "content": f"q{k}: 1+2"}
            WAITED.clear()
            began = time.perf_counter()
            r = http.post(
                "/v1/chat/completions",
                json={"model": "chain", "messages": [*history, question], "max_tokens": 4},
                headers={"X-Conversation-Id": thread},
            )
            latencies.append(time.perf_counter() - began)
            waited.append(sum(WAITED))
            assert r.status_code == 200, r.text
            history += [
                question,
                {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
            ]
    return latencies, waited


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="durability-"))
    run, _ = prepare(work, tiny_model(work / "model"), 1, 0)
    export, add_seen = SQLiteSpanExporter.export, Conversations.add_seen
    results: dict[str, dict[str, list[float]]] = {
        m: {"latency": [], "waited": []} for m in ("durable", "batched")
    }
    for r in range(args.rounds):
        for mode in ("durable", "batched"):
            durable = mode == "durable"
            tracing.SimpleSpanProcessor = SimpleSpanProcessor if durable else BatchSpanProcessor  # type: ignore[misc]
            SQLiteSpanExporter.export = timed_export(export) if durable else export  # type: ignore[method-assign]
            Conversations.add_seen = timed_seen(add_seen) if durable else seen_after_the_answer(add_seen)  # type: ignore[method-assign]
            config = ServeConfig.from_run_dir(run, "chain", conversations_path=f"conversations-{mode}-{r}.db")
            config.tracing.sqlite_path = f"traces-{mode}-{r}.db"
            with BackgroundServer(lambda config=config: build_server(config)) as server:
                requests(server.url, 4, f"warm-{mode}-{r}")
                latencies, waited = requests(server.url, args.requests, f"{mode}-{r}")
            results[mode]["latency"] += latencies
            results[mode]["waited"] += waited
    summary = {
        mode: {
            "requests": len(v["latency"]),
            "p50_ms": 1000 * statistics.median(v["latency"]),
            "mean_ms": 1000 * statistics.fmean(v["latency"]),
            "durable_writes_mean_ms": 1000 * statistics.fmean(v["waited"]) if mode == "durable" else None,
        }
        for mode, v in results.items()
    }
    print(json.dumps(summary, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
