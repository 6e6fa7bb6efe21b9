"""A chat request checked against the server's limits and ready to run (`Completion`): what the service
(serving/service.py) validates before it admits a request, and the deadline every request runs under.

A request's sizes are checked before anything runs: `max_tokens` and `max_completion_tokens` agree and
stay under the server's limit, `n` stays under its limit and is 1 when streaming; its deadline is the
`timeout` field, else the `X-Request-Timeout` header, else the server's limit, and never over it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from teamtr.client.protocol import ChatCompletionRequest, ChatMessage
from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.team import Team
from teamtr.serving.episodes import ServedTeam
from teamtr.serving.errors import APIError
from teamtr.serving.settings import ServeSettings

CONVERSATION_HEADER = "X-Conversation-Id"
TIMEOUT_HEADER = "X-Request-Timeout"


def deadline_error(timeout_s: float) -> APIError:
    return APIError(
        408,
        f"the request's deadline ({timeout_s:g} s) passed before the team answered; its episodes were "
        "cancelled",
        "timeout_error",
        param="timeout",
        code="deadline_exceeded",
    )


@dataclass
class Completion:
    """A validated request, ready to run: its team (and the variant with its sampling), task and ids."""

    request: ChatCompletionRequest
    team: ServedTeam
    task: str
    completion_id: str
    conversation_id: str
    graph: Team | None = None  # the team variant sampling as asked (None: the team as served)
    sampling: dict[str, SamplingParams] = field(default_factory=dict)
    asked: dict[str, Any] = field(default_factory=dict)  # the sampling fields the request set
    n: int = 1
    timeout_s: float = 600.0
    arrived: float = field(default_factory=time.monotonic)
    new_messages: list[ChatMessage] = field(default_factory=list)  # what this request adds to its thread
    known: int = 0  # how many of the request's messages the thread had (the seen digests after them go)
    owner: str | None = None  # the caller's key digest (serving/auth.py key_owner); None: an open API

    def remaining(self) -> float:
        return self.timeout_s - (time.monotonic() - self.arrived)


def checked_n(request: ChatCompletionRequest, settings: ServeSettings) -> int:
    """The request's number of choices, once its token caps and `n` are within the server's limits
    (APIError 400 otherwise)."""
    if (
        request.max_tokens is not None
        and request.max_completion_tokens is not None
        and request.max_tokens != request.max_completion_tokens
    ):
        raise APIError(
            400,
            "max_tokens and max_completion_tokens disagree; send one of them",
            param="max_completion_tokens",
        )
    cap = request.turn_token_cap()
    if cap is not None and cap > settings.max_tokens_limit:
        raise APIError(
            400,
            f"max_tokens {cap} is over this server's limit {settings.max_tokens_limit}",
            param="max_tokens",
            code="context_length_exceeded",
        )
    n = request.n or 1
    if n > settings.max_n:
        raise APIError(400, f"n = {n} is over this server's limit {settings.max_n}", param="n")
    if n > 1 and request.stream:
        raise APIError(400, "n > 1 is not supported with stream: true", param="n")
    return n


def request_timeout(field_value: float | None, header: str | None, limit: float) -> float:
    """The request's deadline in seconds: its `timeout` field, else its header, else `limit`."""
    asked, param = field_value, "timeout"
    if asked is None and header is not None:
        param = TIMEOUT_HEADER
        try:
            asked = float(header)
        except ValueError:
            asked = -1.0
        if not 0 < asked < float("inf"):
            raise APIError(400, f"{TIMEOUT_HEADER} must be a positive number of seconds", param=param)
    if asked is None:
        return limit
    if asked > limit:
        raise APIError(400, f"{param} {asked:g} s is over this server's limit {limit:g} s", param=param)
    return asked
