"""Generation throughput: a real vLLM server vs the embedded engine, same model, same requests.

    .venv/bin/python benchmarks/vllm_vs_embedded.py [--model DIR] [--new-tokens 64] [--batches 1 16]

For each batch size B, B concurrent `generate` calls (B different prompts, `max_new_tokens` tokens each,
temperature 1, seeded) go to each engine; the engines alternate over `--repeats` rounds after a warm-up,
and the median tokens/s of each is reported with the ratio vLLM / embedded. Both use one CPU thread
(vLLM's CPU backend binds one core and keeps one for its server on this 2-core machine). Without
`--model` a random Llama the size of the demo model (hidden 128, 4 layers, 4 heads) is built. Also
runs one round with a LoRA adapter on every request. Rows go to stdout and, with --out, to JSONL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from teamtr.engines.open import EngineSpec, open_engine
from teamtr.engines.random_adapters import random_lora_adapter
from teamtr.graphs.engine import Engine, SamplingParams
from teamtr.training.tiny_models import build_char_tokenizer
from teamtr.training.warmstart import new_model, save_model


def build_model(out_dir: Path) -> Path:
    tokenizer = build_char_tokenizer()
    save_model(new_model(tokenizer, hidden=128, layers=4, heads=4, seed=0), tokenizer, out_dir)
    return out_dir


async def tokens_per_second(
    engine: Engine, prompts: list[list[int]], adapter: str | None, new_tokens: int
) -> float:
    start = time.perf_counter()
    gens = await asyncio.gather(
        *(
            engine.generate(p, adapter=adapter, sampling=SamplingParams(max_new_tokens=new_tokens, seed=i))
            for i, p in enumerate(prompts)
        )
    )
    elapsed = time.perf_counter() - start
    return sum(len(g.completion_ids) for g in gens) / elapsed


async def measure(
    engines: dict[str, Engine], prompts, adapter, new_tokens: int, repeats: int
) -> dict[str, float]:
    for engine in engines.values():  # warm-up
        await tokens_per_second(engine, prompts, adapter, new_tokens)
    rates: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(repeats):  # alternate, so load from other processes hits both alike
        for name, engine in engines.items():
            rates[name].append(await tokens_per_second(engine, prompts, adapter, new_tokens))
    return {name: statistics.median(r) for name, r in rates.items()}


async def run(args: argparse.Namespace) -> list[dict]:
    work = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    model_dir = Path(args.model) if args.model else build_model(work / "model")
    adapter_dir = random_lora_adapter(model_dir, work / "adapter", seed=1, rank=8, std=0.1)
    embedded = open_engine(EngineSpec(bases={"base": str(model_dir)}, threads=1)).engine
    embedded.load_adapter_sync("role", adapter_dir)
    opened = open_engine(EngineSpec(bases={"base": str(model_dir)}, kind="vllm", dtype="float32"))
    rows = []
    try:
        vllm = opened.engine
        await vllm.load_adapter("role", str(adapter_dir))
        engines: dict[str, Engine] = {"embedded": embedded, "vllm": vllm}
        tok = embedded.tokenizer()
        for adapter in (None, "role"):
            for batch in args.batches:
                prompts = [tok(f"{i}+{3 * i + 7}=")["input_ids"] for i in range(batch)]
                rate = await measure(engines, prompts, adapter, args.new_tokens, args.repeats)
                rows.append(
                    {
                        "batch": batch,
                        "adapter": adapter or "base",
                        "new_tokens": args.new_tokens,
                        "embedded_tok_s": round(rate["embedded"], 1),
                        "vllm_tok_s": round(rate["vllm"], 1),
                        "ratio_vllm_over_embedded": round(rate["vllm"] / rate["embedded"], 2),
                    }
                )
    finally:
        opened.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", help="model directory (default: a random demo-sized Llama)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="append the rows to this JSONL file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = asyncio.run(run(args))
    table = Table(
        title=f"generation throughput, {args.new_tokens} new tokens per request (median of {args.repeats})"
    )
    for column in rows[0]:
        table.add_column(column)
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    Console().print(table)
    if args.out:
        with open(args.out, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
