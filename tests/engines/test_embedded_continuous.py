"""Continuous batching in the embedded engine (engines/embedded.py, decode_in_thread):
a call that arrives while a batch decodes joins it at the next step and is answered before the running
rows finish; a finished row leaves at once; greedy rows decode what they decode alone and seeded rows
sample the same tokens whatever joins or leaves around them; each row keeps its own adapter; an adapter
that running rows use changes only once they have finished, while other adapters change between steps.

Every arrival is made from the engine's step listener (the decoding thread), which waits until the loop
has queued the call: the schedule is fixed by steps, not by timing."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import torch

from teamtr.engines.embedded import EmbeddedEngine
from teamtr.engines.random_adapters import randomise_adapters
from teamtr.graphs.engine import Generation, SamplingParams

PROMPTS = {"a": "1+2+3=", "b": "4+5=", "c": "12+7+30+5", "d": "2+2="}


@pytest.fixture
def engine(tiny_model_dir) -> EmbeddedEngine:
    torch.manual_seed(2)  # the fresh adapters' LoRA A matrices, whatever ran before
    eng = EmbeddedEngine(
        tiny_model_dir, adapters={"solver": None, "critic": None}, threads=1, decode_in_thread=True
    )
    randomise_adapters(eng, ("solver", "critic"), std=0.3, seed=3)  # differ from the base and each other
    return eng


def call(engine: EmbeddedEngine, key: str, adapter: str | None, sampling: SamplingParams) -> Coroutine:
    return engine.generate(engine.tokenizer()(PROMPTS[key])["input_ids"], adapter=adapter, sampling=sampling)


def solo(engine: EmbeddedEngine, key: str, adapter: str | None, sampling: SamplingParams) -> Generation:
    async def go() -> Generation:
        return await call(engine, key, adapter, sampling)

    return asyncio.run(go())


def close(a: Generation, b: Generation) -> bool:
    """The same tokens, log-probs equal but for float32's last bits (batch sizes and padding differ)."""
    gap = max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True))
    return a.completion_ids == b.completion_ids and a.finish_reason == b.finish_reason and gap < 1e-5


Action = Callable[[dict[str, asyncio.Task]], Any]


def start(**calls: Callable[[], Coroutine]) -> Action:
    """An action that starts these calls as tasks of those names."""
    return lambda tasks: tasks.update({name: asyncio.ensure_future(make()) for name, make in calls.items()})


class Schedule:
    """Starts `first`, then runs each action of `later` on the event loop right after forward pass k of
    the engine (the decoding thread waits until the loop has let the tasks it started queue their calls).
    Records the rows of every forward pass and what each action returned."""

    def __init__(self, engine: EmbeddedEngine) -> None:
        self.engine, self.steps, self.seen = engine, [], {}

    def run(self, first: Action, later: dict[int, Action]) -> dict[str, Any]:
        """Each task's result (None for a cancelled one), once every action has run and every task ended."""

        async def go() -> dict[str, Any]:
            loop = asyncio.get_running_loop()
            tasks: dict[str, asyncio.Task] = {}

            def act(k: int, queued: threading.Event) -> None:
                self.seen[k] = later[k](tasks)
                loop.call_soon(lambda: loop.call_soon(queued.set))  # the new tasks run up to their queueing

            def listener(rows: int) -> None:  # in the decoding thread
                self.steps.append(rows)
                if len(self.steps) in later:
                    queued = threading.Event()
                    loop.call_soon_threadsafe(act, len(self.steps), queued)
                    assert queued.wait(10)

            self.engine.step_listener = listener
            first(tasks)
            while len(self.seen) < len(later) or not all(t.done() for t in tasks.values()):
                await asyncio.sleep(0.01)
            self.engine.step_listener = None
            return {n: None if t.cancelled() else t.result() for n, t in tasks.items()}

        return asyncio.run(go())


def test_a_call_arriving_mid_decode_joins_the_running_batch_and_leaves_when_done(engine):
    long, short = (
        SamplingParams(temperature=0.0, max_new_tokens=30),
        SamplingParams(temperature=0.0, max_new_tokens=8),
    )
    alone = {"a": solo(engine, "a", "solver", long), "b": solo(engine, "b", "critic", short)}
    assert [len(g.completion_ids) for g in alone.values()] == [30, 8]  # greedy runs to max_new_tokens here
    joined_before = engine.joined_running

    sched = Schedule(engine)
    out = sched.run(
        start(a=lambda: call(engine, "a", "solver", long)),
        {
            5: start(b=lambda: call(engine, "b", "critic", short)),  # arrives after a's 5th forward pass
            20: lambda tasks: (tasks["b"].done(), tasks["a"].done()),
        },
    )
    # a: prefill + 4 steps alone; b's prefill (1 row), 7 steps together (b's tokens 2..8), then a alone
    assert sched.steps == [1] * 5 + [1] + [2] * 7 + [1] * (30 - 5 - 7)
    assert sched.seen[20] == (True, False)  # b was answered while a still decoded
    assert engine.joined_running - joined_before == 1
    assert close(out["a"], alone["a"]) and close(out["b"], alone["b"])  # per-row adapters, greedy = solo


def test_a_seeded_call_samples_the_same_tokens_whatever_joins_or_leaves(engine):
    def seeded(seed: int, tokens: int) -> SamplingParams:
        return SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=tokens, seed=seed)

    calls = {  # name -> (prompt, adapter, sampling)
        "a": ("a", "solver", seeded(7, 24)),
        "b": ("b", None, seeded(8, 6)),
        "c": ("c", "critic", seeded(9, 10)),
        "d": ("d", "solver", seeded(10, 12)),
    }
    alone = {k: solo(engine, *spec) for k, spec in calls.items()}
    makers = {k: (lambda k=k: call(engine, *calls[k])) for k in calls}

    sched = Schedule(engine)
    out = sched.run(start(a=makers["a"], b=makers["b"]), {3: start(c=makers["c"]), 9: start(d=makers["d"])})
    assert max(sched.steps) == 3  # rows joined and left around each other
    for k in calls:
        assert close(out[k], alone[k]), k
    # the same calls in another arrival order sample the same tokens again
    out = Schedule(engine).run(
        start(d=makers["d"]), {2: start(a=makers["a"], c=makers["c"]), 4: start(b=makers["b"])}
    )
    for k in calls:
        assert close(out[k], alone[k]), k


def test_a_joined_row_cancelled_mid_decode_frees_its_row(engine):
    greedy = SamplingParams(temperature=0.0, max_new_tokens=20)
    alone = solo(engine, "a", "solver", greedy)
    cancelled_before = engine.cancelled_calls
    sched = Schedule(engine)
    out = sched.run(
        start(a=lambda: call(engine, "a", "solver", greedy)),
        {3: start(c=lambda: call(engine, "c", "critic", greedy)), 8: lambda tasks: tasks["c"].cancel()},
    )
    # c joins after forward 3 (its prefill is forward 4), is cancelled at forward 8, gone from 9 on
    assert sched.steps == [1] * 3 + [1] + [2] * 4 + [1] * (20 - 3 - 4)
    assert out["c"] is None and engine.cancelled_calls - cancelled_before == 1
    assert close(out["a"], alone)


def test_adapters_change_between_steps_but_never_under_a_running_row(engine, tmp_path):
    """Loading a new adapter happens mid-batch; replacing the one a running row uses waits for the row to
    finish (the row decodes with the weights it started with), and a call for it waits for the new one."""
    engine.save_adapter("critic", tmp_path / "critic")
    greedy = SamplingParams(temperature=0.0, max_new_tokens=16)
    alone_old = solo(engine, "a", "solver", greedy)
    done_at: dict[str, int] = {}
    sched = Schedule(engine)

    async def change(name: str, coro: Coroutine) -> None:
        await coro
        done_at[name] = len(sched.steps)

    out = sched.run(
        start(a=lambda: call(engine, "a", "solver", greedy)),
        {
            3: start(
                new=lambda: change("new", engine.load_adapter("extra", str(tmp_path / "critic"))),
                replace=lambda: change("solver", engine.load_adapter("solver", str(tmp_path / "critic"))),
            ),
            5: start(b=lambda: call(engine, "b", "solver", greedy)),  # asks for the solver being replaced
            10: lambda tasks: tasks["b"].done(),
        },
    )
    assert done_at["new"] == 3  # between two steps of the running batch
    assert done_at["solver"] == 16  # once the row that used the old solver had finished
    assert close(out["a"], alone_old)  # decoded with the solver it started with
    b_alone = solo(engine, "b", "critic", greedy)  # the new solver has the critic's weights
    assert close(out["b"], b_alone)
    assert sched.steps == [1] * (16 + len(b_alone.completion_ids)) and sched.seen[10] is False  # b waited
    assert engine.adapters() == ["solver", "critic", "extra"]
