"""A caller that goes away frees its decoding row. The real embedded engine drops a
cancelled call before its batch forms, and a row cancelled mid-decode leaves the batch at the next step
while the other rows sample the tokens they would have; through the API, a client that disconnects frees
its row; the real vLLM server aborts the request of a cancelled call (docs/serving.md, "Limits";
docs/vllm.md, "Cancellation")."""

from __future__ import annotations

import asyncio
import re
import threading
import time

import httpx
import pytest

from teamtr.engines.embedded import EmbeddedEngine
from teamtr.engines.random_adapters import randomise_adapters
from teamtr.engines.vllm_http import VLLMClient
from teamtr.engines.vllm_server import VLLMServer
from teamtr.graphs.engine import Generation, SamplingParams
from teamtr.serving.server import ServeConfig, ServedTeamConfig
from tests.support.serving import make_run_dir, serve_in_background

PROMPTS = ["1+2+3=", "4+5=", "6+7+8+9=", "2+2="]
ADAPTERS = ["solver", "critic", None, "solver"]  # mixed: the per-row adapter names are narrowed too
CANCELLED_ROW = 2
LONG, SHORT = 40, 12  # the cancelled row asks for the most tokens: it alone would hold the batch open


@pytest.fixture
def engine(tiny_model_dir) -> EmbeddedEngine:
    eng = EmbeddedEngine(tiny_model_dir, adapters={"solver": None, "critic": None}, threads=1)
    randomise_adapters(eng, ("solver", "critic"), std=0.3, seed=3)  # differ from the base and each other
    return eng


def sampling(row: int) -> SamplingParams:
    # no stop strings; the random model samples its EOS now and then, so rows may end early
    tokens = LONG if row == CANCELLED_ROW else SHORT
    return SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=tokens, seed=100 + row)


def start(engine: EmbeddedEngine, rows: list[int]) -> dict[int, asyncio.Task]:
    tok = engine.tokenizer()
    return {
        i: asyncio.create_task(
            engine.generate(tok(PROMPTS[i])["input_ids"], adapter=ADAPTERS[i], sampling=sampling(i))
        )
        for i in rows
    }


def run(engine: EmbeddedEngine, rows: list[int]) -> tuple[dict[int, Generation], list[int]]:
    """Decode `rows` as one batch, nothing cancelled: each row's generation and the rows per step."""
    steps: list[int] = []
    engine.step_listener = steps.append

    async def go() -> dict[int, Generation]:
        tasks = start(engine, rows)
        return {i: await t for i, t in tasks.items()}

    return asyncio.run(go()), steps


def same(a: Generation, b: Generation) -> bool:
    return (
        a.completion_ids == b.completion_ids
        and a.logprobs == b.logprobs
        and a.finish_reason == b.finish_reason
    )


def same_tokens(a: Generation, b: Generation) -> bool:
    """The same tokens, log-probs equal but for float32's last bits: a batch of 3 rows computes each row's
    logits with slightly different rounding than a batch of 4 (so do the two uncancelled runs below)."""
    gap = max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True))
    return a.completion_ids == b.completion_ids and a.finish_reason == b.finish_reason and gap < 1e-5


def test_a_row_cancelled_mid_decode_leaves_the_batch_at_the_next_step(engine):
    everyone, full_steps = run(engine, [0, 1, 2, 3])
    longest = len(everyone[CANCELLED_ROW].completion_ids)
    others = max(len(everyone[i].completion_ids) for i in (0, 1, 3))
    assert longest > others, "these seeds make the cancelled row the one that holds the batch open"
    assert full_steps == [4] * longest  # finished rows stay in the batch until it ends
    without, _ = run(engine, [0, 1, 3])

    cancel_after = 5
    steps: list[int] = []
    tasks: dict[int, asyncio.Task] = {}

    def listener(rows: int) -> None:
        steps.append(rows)
        if len(steps) == cancel_after:  # the caller goes away while its row is being decoded
            tasks[CANCELLED_ROW].cancel()

    async def go() -> dict[int, Generation]:
        tasks.update(start(engine, [0, 1, 2, 3]))
        with pytest.raises(asyncio.CancelledError):
            await tasks[CANCELLED_ROW]
        return {i: await tasks[i] for i in (0, 1, 3)}

    engine.step_listener = listener
    rows_before, cancelled_before = engine.decoded_rows, engine.cancelled_calls
    outputs = asyncio.run(go())
    # its row is gone from the very next forward pass, and the batch ends with the others
    assert steps == [4] * cancel_after + [3] * (others - cancel_after)
    assert engine.decoded_rows - rows_before == sum(steps) < sum(full_steps)
    assert engine.cancelled_calls - cancelled_before == 1
    for i in (0, 1, 3):  # the others sample what they sample with it, and without it
        assert same_tokens(outputs[i], everyone[i])
        assert same_tokens(outputs[i], without[i])


def test_a_call_cancelled_while_queued_is_never_decoded(engine):
    without, without_steps = run(engine, [0, 1, 3])
    steps: list[int] = []
    engine.step_listener = steps.append

    async def go() -> dict[int, Generation]:
        tasks = start(engine, [0, 1, 2, 3])
        await asyncio.sleep(0)  # every call is queued; the batch forms once the loop is quiet
        assert len(engine._pending["base"]) == 4
        tasks[CANCELLED_ROW].cancel()
        return {i: await tasks[i] for i in (0, 1, 3)}

    cancelled_before = engine.cancelled_calls
    outputs = asyncio.run(go())
    assert steps == without_steps == [3] * max(len(g.completion_ids) for g in without.values())
    assert engine.cancelled_calls - cancelled_before == 1
    assert all(same(outputs[i], without[i]) for i in outputs)  # bit for bit: the batch never held it


def test_cancelling_while_decoding_in_a_thread(tiny_model_dir):
    """Serving's mode: the loop stays free while a worker thread decodes, and a cancellation made on the
    loop between two steps takes the row out at the next one."""
    engine = EmbeddedEngine(tiny_model_dir, threads=1, decode_in_thread=True)
    tok = engine.tokenizer()
    cancel_after, steps = 3, []
    cancelled = threading.Event()

    async def go() -> tuple[Generation, Generation]:
        loop = asyncio.get_running_loop()
        prompt = tok(PROMPTS[0])["input_ids"]
        stays = asyncio.create_task(engine.generate(prompt, adapter=None, sampling=sampling(0)))
        goes = asyncio.create_task(engine.generate(prompt, adapter=None, sampling=sampling(CANCELLED_ROW)))

        def cancel() -> None:
            goes.cancel()
            cancelled.set()

        def listener(rows: int) -> None:  # runs in the decoding thread
            steps.append(rows)
            if len(steps) == cancel_after:
                loop.call_soon_threadsafe(cancel)
                assert cancelled.wait(10)

        engine.step_listener = listener
        with pytest.raises(asyncio.CancelledError):
            await goes
        alone = await stays
        engine.step_listener = None
        solo = await engine.generate(prompt, adapter=None, sampling=sampling(0))
        return alone, solo

    alone, solo = asyncio.run(go())
    assert len(alone.completion_ids) > cancel_after, "these seeds keep the row going past the cancellation"
    assert steps == [2] * cancel_after + [1] * (len(alone.completion_ids) - cancel_after)
    assert engine.cancelled_calls == 1
    assert same_tokens(alone, solo)  # what the same seed decodes on its own


def test_a_client_that_disconnects_frees_its_row_through_the_api(tiny_model_dir, tmp_path):
    """The whole path: the client closes its connection, the server cancels the episode, the engine takes
    the row out at its next decoding step and decodes nothing more for it."""
    run_dir = make_run_dir(tiny_model_dir, tmp_path / "run", versions=1)
    config = ServeConfig(
        model=str(tiny_model_dir),
        teams={"chain": ServedTeamConfig(run_dir=str(run_dir))},
        tracing={"sqlite_path": None},
    )
    engine = EmbeddedEngine(str(tiny_model_dir), threads=1, decode_in_thread=True)
    steps: list[int] = []
    step_s = 0.0

    def listener(rows: int) -> None:  # in the decoding thread: slows decoding down so the client can go
        steps.append(rows)
        time.sleep(step_s)

    engine.step_listener = listener
    # seeded sampling: the tiny random model's greedy turns can end after a token or two
    body = {
        "model": "chain",
        "messages": [{"role": "user", "content": "12+7+30+5"}],
        "temperature": 1.0,
        "seed": 3,
    }

    async def leave_once_decoding(url: str) -> int:
        """Send the request, close the connection at the engine's first step: the steps decoded by then."""
        async with httpx.AsyncClient(timeout=60) as client:
            call = asyncio.create_task(client.post(url, json=body))
            while not steps:
                assert not call.done()
                await asyncio.sleep(0.01)
            call.cancel()
            gone_at = len(steps)
            with pytest.raises(asyncio.CancelledError):
                await call
            return gone_at

    with serve_in_background(config, engine=engine) as served:
        url = served.url + "/v1/chat/completions"
        answer = httpx.post(url, json=body, timeout=60)
        first_turn = answer.json()["teamtr"]["turns"][0]["completion_tokens"]  # its steps: a batch of one
        assert first_turn >= 6, "this seed's first turn is long enough to tell stopping from finishing"
        steps.clear()
        step_s = 0.2
        gone_at = asyncio.run(leave_once_decoding(url))
        deadline = time.monotonic() + 10
        while engine.cancelled_calls == 0:
            assert time.monotonic() - deadline < 0, "the engine never saw the cancellation"
            time.sleep(0.05)
        assert len(steps) <= gone_at + 2 < first_turn  # the step in flight, at most one more (latency)
        settled = len(steps)
        time.sleep(1.0)
        assert len(steps) == settled  # nothing more is decoded for it: no later turn either
        assert engine.cancelled_calls == 1
        assert httpx.get(served.url + "/health").json()["in_flight"] == 0


async def vllm_metric(http: httpx.AsyncClient, name: str, **labels: str) -> float:
    """The sum of a vLLM Prometheus metric's samples that carry these labels. Asynchronous: a blocking
    call here would stall the very calls the test is watching."""
    total = 0.0
    for line in (await http.get("/metrics", timeout=30)).text.splitlines():
        match = re.fullmatch(rf"{re.escape(name)}(?:{{(.*)}})? (\S+)", line)
        if match and all(f'{k}="{v}"' in (match.group(1) or "") for k, v in labels.items()):
            total += float(match.group(2))
    return total


async def wait_for(
    condition, timeout_s: float, calls: list[asyncio.Task] = (), server: VLLMServer | None = None
) -> float:
    """Seconds until `await condition()` holds. A call that fails meanwhile fails the wait at once with
    its error, and a time-out shows the server log's tail, so a failure says what happened."""
    start = time.monotonic()
    while not await condition():
        failed = [task for task in calls if task.done() and task.exception() is not None]
        if failed:
            tail = server.log_tail(15) if server else ""
            raise AssertionError(
                f"{len(failed)} calls failed after {time.monotonic() - start:.1f} s: "
                f"{failed[0].exception()!r}; server log tail:\n{tail}"
            )
        if time.monotonic() - start >= timeout_s:
            tail = server.log_tail() if server else ""
            raise AssertionError(f"timed out after {timeout_s} s; server log tail:\n{tail}")
        await asyncio.sleep(0.02)
    return time.monotonic() - start


@pytest.mark.vllm
@pytest.mark.slow
async def test_vllm_aborts_the_requests_of_cancelled_calls(vllm_server: VLLMServer) -> None:
    """Cancelling the engine's HTTP calls (what the API does when a client disconnects) closes their
    connections, and vLLM aborts their requests in its engine core: the ones still decoding or queued
    never run to the length they asked for, and nothing decodes on for them.
    The calls outnumber vLLM's running batch (`max_num_seqs`, 128 on CPU) four times over, so most are
    queued when the test sees decoding start however late its poll of /metrics is answered (CI once
    answered it only after 100 of 128 calls that all ran at once had finished), and with `ignore_eos` a
    request that is not aborted decodes exactly `max_tokens`. (vLLM 0.32 does not count aborted requests
    in `request_success_total{finished_reason="abort"}`, so the aborts show as requests that neither
    finished nor still run.)"""
    # a new connection per poll: the busy server's event loop can stall past uvicorn's 5 s keep-alive,
    # then closes an idle kept-alive connection as the next poll arrives on it
    http = httpx.AsyncClient(base_url=vllm_server.url, limits=httpx.Limits(max_keepalive_connections=0))
    calls, max_tokens = 512, 500  # the tiny model's max_model_len is 512
    finished = lambda: vllm_metric(http, "vllm:request_success_total")  # noqa: E731
    running = lambda: vllm_metric(http, "vllm:num_requests_running")  # noqa: E731
    waiting = lambda: vllm_metric(http, "vllm:num_requests_waiting")  # noqa: E731
    tokens = lambda: vllm_metric(http, "vllm:generation_tokens_total")  # noqa: E731
    finished_before, tokens_before = await finished(), await tokens()
    payload = {  # as VLLMEngine.generate sends it, plus ignore_eos: the random model must not stop early
        "model": vllm_server.served_model_name,
        "prompt": [5, 6, 7, 8],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 1.0,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
    }
    client = VLLMClient(max_concurrency=calls, timeout_s=300)  # the engine's own HTTP client
    tasks = [
        asyncio.create_task(client.post(vllm_server.url, "/v1/completions", payload)) for _ in range(calls)
    ]

    async def decoding() -> bool:
        return await tokens() > tokens_before

    await wait_for(decoding, timeout_s=120, calls=tasks, server=vllm_server)
    for task in tasks:
        task.cancel()
    cancelled = 0
    for task in tasks:  # a call whose response had come back before the cancel keeps its result
        try:
            await task
        except asyncio.CancelledError:
            cancelled += 1

    async def idle() -> bool:
        return await running() == 0 and await waiting() == 0

    await wait_for(idle, timeout_s=30)
    decoded = await tokens() - tokens_before
    ran_out = await finished() - finished_before
    await asyncio.sleep(1.0)
    assert await tokens() - tokens_before == decoded  # nothing decodes on for the aborted requests
    assert await finished() - finished_before == ran_out
    # not aborted, every request would run to max_tokens: all `calls` would finish, decoding calls*max_tokens
    assert ran_out < calls and decoded < calls * max_tokens, (ran_out, decoded, cancelled)
    await http.aclose()
    await client.aclose()
    client.close()
