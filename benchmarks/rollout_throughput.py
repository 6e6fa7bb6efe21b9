"""Rollout throughput through the team graph vs raw batched `generate`, measured side by side.

    python benchmarks/rollout_throughput.py [--episodes 1 32] [--tokens 16] [--threads 1]

For E concurrent episodes of the 3-role chain team (3 turns each, every turn exactly T new tokens:
no stop string, EOS suppressed by the untrained model's size... counted, not assumed), the graph path runs
LangGraph + EngineChatModel + the embedded engine's batcher; the raw path calls HF `model.generate` on
the same model with the same prompts, batch E, three times (one per turn position), T new tokens each.
Prints tokens/s of both and their ratio (goal: graph >= 0.7x raw at 32 episodes).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

from teamtr.engines.embedded import EmbeddedEngine
from teamtr.engines.open import EngineSpec, open_engine
from teamtr.graphs.chain_team import chain_team
from teamtr.graphs.engine import SamplingParams
from teamtr.tasks import get_task
from teamtr.training.tiny_models import build_char_tokenizer, tiny_llama_config


def build_model(out: Path) -> Path:
    torch.manual_seed(0)
    tok = build_char_tokenizer()
    LlamaForCausalLM(tiny_llama_config(len(tok))).save_pretrained(out)  # the demo size: 128 x 4 layers
    tok.save_pretrained(out)
    return out


def graph_rollouts(
    engine: EmbeddedEngine, episodes: int, tokens: int
) -> tuple[int, float, list[list[list[int]]]]:
    team = chain_team(engine, sampling=SamplingParams(temperature=1.0, max_new_tokens=tokens))
    tasks = get_task("chain").generate(episodes, seed=0)
    t0 = time.perf_counter()
    trajs = team.run(tasks, seed=0)
    dt = time.perf_counter() - t0
    prompts = [[turn.prompt_ids for turn in tr.turns] for tr in trajs]
    return sum(tr.num_tokens for tr in trajs), dt, prompts


@torch.no_grad()
def raw_generate(engine: EmbeddedEngine, prompts: list[list[list[int]]], tokens: int) -> tuple[int, float]:
    """The same contexts, batched per turn position, through HF generate with one adapter active."""
    model, tok = engine.model(), engine.tokenizer()
    model.set_adapter("adder1")
    total, t0 = 0, time.perf_counter()
    for k in range(len(prompts[0])):
        rows = [p[k] for p in prompts]
        width = max(map(len, rows))
        ids = torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in rows])
        mask = (torch.arange(width)[None] >= torch.tensor([width - len(r) for r in rows])[:, None]).long()
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            do_sample=True,
            pad_token_id=tok.pad_token_id,
        )
        total += (out.shape[1] - width) * len(rows)
    return total, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as d:
        engine = open_engine(EngineSpec(bases={"base": str(build_model(Path(d)))}, threads=args.threads)).engine
        for k in (1, 2, 3):
            engine.add_adapter(f"adder{k}")
        graph_rollouts(engine, 2, 4)  # warm-up
        print(f"{'episodes':>8} {'graph tok/s':>12} {'raw tok/s':>10} {'ratio':>6}")
        for e in args.episodes:
            g_rates, r_rates = [], []
            for _ in range(args.repeats):  # interleaved, best of N: the machine is shared and noisy
                n, dt, prompts = graph_rollouts(engine, e, args.tokens)
                g_rates.append(n / dt)
                n, dt = raw_generate(engine, prompts, args.tokens)
                r_rates.append(n / dt)
            g, r = max(g_rates), max(r_rates)
            print(f"{e:>8} {g:>12.0f} {r:>10.0f} {g / r:>6.2f}")


if __name__ == "__main__":
    main()
