"""Rollout throughput of a user's LangGraph graph vs the same calls made directly on the engine.

    python benchmarks/graph_rollout_throughput.py [--episodes 32] [--tokens 16] [--threads 1] [--repeats 3]

The graph (written as a user writes one; its only teamtr code is `team.model(role)`): a planner, then two
workers in parallel via `Send` on private views, then a merger; 4 LLM calls per episode, every episode
captured into a `Trajectory` (graphs/capture.py). The direct path makes the same calls on the same
embedded engine with no LangGraph and no LangChain: for each episode, the planner's prompt, then both
workers' prompts at once, then the merger's, each with the prompt ids, adapter and seed of the captured
turn, all episodes concurrently. Same seeds, same rows: both paths sample exactly the same tokens
(checked), so the ratio is the cost of LangGraph, LangChain callbacks, chat-template rendering and
capture. `--team` adds the same measurement for the 3-role chain `Team` (graphs/team.py).
Prints tokens/s of both and their ratio (goal: graph >= 0.9x direct at 32 episodes), the decode batches
each path ran (more on the graph side = batching gaps) and each path's seconds outside the engine's
batched decode (its own per-step overhead). The last column, (graph decode + direct overhead) / graph
time, is the ratio with the decode time of the graph's own run on both sides: the machine's noise, which
moves decode times between runs, cancels out of it.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import operator
import pstats
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypedDict

import torch
from langchain_core.messages import AnyMessage, HumanMessage, SystemMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Send
from rollout_throughput import build_model  # beside this script: the same demo-size model

from teamtr.engines.embedded import EmbeddedEngine
from teamtr.engines.open import EngineSpec, open_engine
from teamtr.graphs.capture import GraphTeam
from teamtr.graphs.chain_team import chain_team
from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.role_models import RoleModels
from teamtr.graphs.roles import Role
from teamtr.graphs.seeds import derive_seed
from teamtr.graphs.trajectory import Trajectory
from teamtr.tasks import get_task

ROLES = ("planner", "left", "right", "merger")



class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    drafts: Annotated[list[str], operator.add]


class View(TypedDict):
    role: str
    view: str


def user_graph(team: RoleModels):
    async def plan(state: State) -> dict:
        return {
            "messages": [await team.model("planner").ainvoke([SystemMessage("Plan."), *state["messages"]])]
        }

    def fan_out(state: State) -> list[Send]:
        plan_text = state["messages"][-1].content
        return [Send("work", {"role": r, "view": f"{r}: {plan_text}"}) for r in ("left", "right")]

    async def work(view: View) -> dict:
        reply = await team.model(view["role"]).ainvoke([SystemMessage("Work."), HumanMessage(view["view"])])
        return {"drafts": [reply.content]}

    async def merge(state: State) -> dict:
        drafts = HumanMessage(" | ".join(state["drafts"]))
        return {"messages": [await team.model("merger").ainvoke([SystemMessage("Merge."), drafts])]}

    g = StateGraph(State)
    g.add_node("plan", plan)
    g.add_node("work", work)
    g.add_node("merge", merge)
    g.add_edge(START, "plan")
    g.add_conditional_edges("plan", fan_out, ["work"])
    g.add_edge("work", "merge")
    g.add_edge("merge", END)
    return g.compile()


async def direct_calls(
    engine: EmbeddedEngine, trajs: list[Trajectory], sampling: SamplingParams
) -> list[int]:
    """The captured turns' calls, made straight on the engine with the graph's dependency structure:
    turns of the same LangGraph step run together, steps one after another; every episode at once."""

    async def episode(traj: Trajectory) -> list[int]:
        steps: dict[Any, list[tuple[int, Any]]] = defaultdict(list)
        for k, turn in enumerate(traj.turns):
            steps[turn.step].append((k, turn))
        counts = []
        for step in sorted(steps):
            gens = await asyncio.gather(
                *(
                    engine.generate(
                        turn.prompt_ids,
                        adapter=turn.adapter,
                        sampling=SamplingParams(
                            temperature=sampling.temperature,
                            max_new_tokens=sampling.max_new_tokens,
                            seed=derive_seed(traj.metadata["seed"], k),
                        ),
                    )
                    for k, turn in steps[step]
                )
            )
            counts += [len(g.completion_ids) for g in gens]
        return counts

    return [n for counts in await asyncio.gather(*(episode(t) for t in trajs)) for n in counts]


@dataclass
class Run:
    seconds: float
    batches: int  # decode batches the engine ran: more than the direct path's = batching gaps
    decode_seconds: float  # inside the engine's batched decode; the rest is the path's own overhead

    @property
    def overhead(self) -> float:
        return self.seconds - self.decode_seconds


def count_decode_time(engine: EmbeddedEngine) -> list[float]:
    """Accumulates the seconds the engine spends in its batched decode (wraps this instance's method)."""
    spent = [0.0]
    decode = engine._decode

    def timed(*args: Any) -> None:
        t0 = time.perf_counter()
        try:
            decode(*args)
        finally:
            spent[0] += time.perf_counter() - t0

    engine._decode = timed  # type: ignore[method-assign]
    return spent


def timed_run(engine: EmbeddedEngine, spent: list[float], fn: Callable[[], Any]) -> tuple[Any, Run]:
    b0, s0, t0 = engine.decode_batches, spent[0], time.perf_counter()
    out = fn()
    return out, Run(time.perf_counter() - t0, engine.decode_batches - b0, spent[0] - s0)


def measure(
    engine: EmbeddedEngine,
    spent: list[float],
    runner: Any,
    episodes: int,
    sampling: SamplingParams,
    seed: int,
) -> tuple[int, Run, Run]:
    """(completion tokens, graph run, direct run) for `episodes` concurrent episodes."""
    tasks = get_task("chain").generate(episodes, seed=seed)
    trajs, graph = timed_run(engine, spent, lambda: runner.run(tasks, seed=seed))
    counts, direct = timed_run(engine, spent, lambda: asyncio.run(direct_calls(engine, trajs, sampling)))
    if counts != [len(turn.completion_ids) for t in trajs for turn in t.turns]:
        raise AssertionError("the direct path sampled different tokens: the comparison would be unfair")
    return sum(counts), graph, direct


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, nargs="+", default=[32])
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--team", action="store_true", help="also measure the 3-role chain Team")
    ap.add_argument("--profile", type=int, default=0, help="print the top N functions of one graph run")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.tokens)  # no stop: fixed-length turns
    with tempfile.TemporaryDirectory() as d:
        adapters = {**{r: None for r in ROLES}, **{f"adder{k}": None for k in (1, 2, 3)}}
        engine = open_engine(EngineSpec(bases={"base": str(build_model(Path(d)))}, threads=args.threads)).engine
        for name in adapters:
            engine.add_adapter(name)
        spent = count_decode_time(engine)
        roles = [Role(r, f"You are the {r}.", adapter=r, sampling=sampling) for r in ROLES]
        runners = {"user graph": GraphTeam(user_graph(RoleModels(engine, roles)), name="bench")}
        if args.team:
            runners["chain Team"] = chain_team(engine, sampling=sampling)
        for runner in runners.values():
            measure(engine, spent, runner, 2, sampling, seed=99)  # warm-up
        print(
            f"{'graph':>10} {'episodes':>8} {'graph tok/s':>12} {'direct tok/s':>12} {'ratio':>6} "
            f"{'batches g/d':>11} {'overhead s g/d':>15} {'ratio at equal decode':>21}"
        )
        for name, runner in runners.items():
            for e in args.episodes:
                runs = [measure(engine, spent, runner, e, sampling, seed=k) for k in range(args.repeats)]
                # best of N (a shared, noisy machine): the fastest graph run and the fastest direct run
                n_g, g = min(((n, g) for n, g, _ in runs), key=lambda x: x[1].seconds / x[0])
                n_d, d_ = min(((n, d_) for n, _, d_ in runs), key=lambda x: x[1].seconds / x[0])
                g_rate, d_rate = n_g / g.seconds, n_d / d_.seconds
                print(
                    f"{name:>10} {e:>8} {g_rate:>12.0f} {d_rate:>12.0f} {g_rate / d_rate:>6.2f} "
                    f"{f'{g.batches}/{d_.batches}':>11} {f'{g.overhead:.3f}/{d_.overhead:.3f}':>15} "
                    f"{(g.decode_seconds + d_.overhead) / g.seconds:>21.2f}"
                )
        if args.profile:
            profiler = cProfile.Profile()
            tasks = get_task("chain").generate(max(args.episodes), seed=0)
            profiler.runcall(runners["user graph"].run, tasks, seed=0)
            pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
