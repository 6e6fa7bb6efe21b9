"""A chat completion as server-sent events (`stream: true`): the role chunk, the answer's content deltas
as its tokens are decoded (which turn is the answer: serving/token_stream.py), with `include_turns` each
turn's text pieces and each turn as it ends, then the finish chunk, usage (if asked) and [DONE]. An
error after the headers went out is reported in-band, as OpenAI does. serving/service.py `stream` runs it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from teamtr.client.protocol import ChatCompletionChunk, ChunkChoice, Delta, TokenPiece, TurnInfo, error_body
from teamtr.graphs.capture import describe_error
from teamtr.serving.chat_messages import usage_of
from teamtr.serving.completion import Completion, deadline_error
from teamtr.serving.episodes import EpisodeResult
from teamtr.serving.errors import APIError, log
from teamtr.serving.token_stream import AnswerStream, final_turn_index

OnTurn = Callable[[TurnInfo], None]
OnToken = Callable[[int, str, str], None]  # (turn index, role, text piece)


async def event_stream(
    c: Completion,
    run: Callable[[OnTurn | None, OnToken], Awaitable[EpisodeResult]],
    release: Callable[[], None],
    first_content_seconds: Callable[[float], None],
) -> AsyncIterator[str]:
    """Server-sent events: the role chunk; the answer's content deltas as its tokens are decoded (which
    turn is the answer: serving/token_stream.py); with include_turns, each turn's text pieces as they
    are decoded and each turn as it ends, and the answer's deltas after the last turn's chunk; the
    finish chunk, usage (if asked), [DONE]. An error after the
    headers went out is reported in-band. The request's places in the queue (taken by `admit`) are
    released when the stream ends (`release`). `run(on_turn, on_token)`: the request's episode;
    `first_content_seconds`: observes the time to its first content delta."""
    options = c.request.stream_options
    include_turns = options is not None and options.include_turns
    events: asyncio.Queue[TurnInfo | TokenPiece] = asyncio.Queue()
    answer = AnswerStream(
        final_turn_index(c.graph or c.team.team),
        {role: p.stop for role, p in c.sampling.items()},
        c.team.answer_role,
    )
    episode: asyncio.Task | None = None
    first_content = True
    held: list[str] = []  # with include_turns: the answer's pieces, sent once every turn chunk is out

    def chunk(**kwargs: Any) -> str:
        body = ChatCompletionChunk(id=c.completion_id, model=c.request.model, **kwargs)
        return f"data: {json.dumps(body.model_dump(exclude_none=True))}\n\n"

    def content(text: str) -> str:
        nonlocal first_content
        if first_content:
            first_content = False
            first_content_seconds(time.monotonic() - c.arrived)
        return chunk(choices=[ChunkChoice(delta=Delta(content=text))])

    def on_token(index: int, role: str, text: str) -> None:
        events.put_nowait(TokenPiece(index=index, role=role, text=text))

    try:
        on_turn = events.put_nowait if include_turns else None
        episode = asyncio.create_task(run(on_turn, on_token))
        yield chunk(choices=[ChunkChoice(delta=Delta(role="assistant", content=""))])
        while not episode.done() or not events.empty():
            getter = asyncio.ensure_future(events.get())
            await asyncio.wait(
                {getter, episode}, timeout=max(0.0, c.remaining()), return_when=asyncio.FIRST_COMPLETED
            )
            if not getter.done():
                getter.cancel()
                if not episode.done():
                    raise deadline_error(c.timeout_s)
                continue
            event = getter.result()
            if isinstance(event, TurnInfo):
                yield chunk(choices=[], teamtr_turn=event)
                continue
            if include_turns:
                yield chunk(choices=[], teamtr_token=event)
            new = answer.piece(event.index, event.role, event.text)
            if new and include_turns:  # the turn chunks come first, so the answer waits for the last
                held.append(new)
            elif new:
                yield content(new)
        result = episode.result()
    except Exception as e:  # headers are gone: report in-band, as OpenAI does, then end the stream
        if isinstance(e, APIError):
            body = error_body(e.message, e.type, e.param, e.code)
        else:
            log.error("stream of %s failed: %s", c.completion_id, describe_error(e), exc_info=e)
            body = error_body(f"internal error: {describe_error(e)}", "server_error")
        yield f"data: {json.dumps(body)}\n\n"
        yield "data: [DONE]\n\n"
        return
    finally:
        if episode is not None and not episode.done():  # the client went away, or the deadline
            episode.cancel()
            await asyncio.gather(episode, return_exceptions=True)
        release()
    for piece in held:
        yield content(piece)
    rest = answer.finish(result.trajectory.final_answer or "")
    if rest or first_content:
        yield content(rest)
    yield chunk(choices=[ChunkChoice(delta=Delta(), finish_reason=result.finish_reason)])
    if options is not None and options.include_usage:
        yield chunk(choices=[], usage=usage_of(result.trajectory))
    yield "data: [DONE]\n\n"
