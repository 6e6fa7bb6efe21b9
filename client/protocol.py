"""The wire format of the team chat API: OpenAI's chat-completions shapes, plus small documented extensions
(the admin API's shapes: client/admin_protocol.py).

Every request field is either honoured or refused: a field the server does not declare (`tools`,
`response_format`, `logprobs`, ...) is a 400 naming it (serving/errors.py words it), unless its value
asks for nothing (null, or OpenAI's neutral default such as `logprobs: false`; NEUTRAL_VALUES below).
docs/serving.md has the table of OpenAI's fields and what the server does with each.

Extensions (all opt-in, ignored by plain OpenAI clients):
- request `stream_options.include_turns: true` streams one chunk per agent turn before the answer; the
  chunk has `choices: []` and a `teamtr_turn` object (role, adapter, version, text, token counts); while
  each turn is decoded, chunks with `choices: []` and a `teamtr_token` object (turn index, role, text
  piece) stream its text.
- request `metadata.conversation_id` groups several requests into one conversation (for feedback and
  traces); by default every request is its own conversation, named by the response `id`.
- request `timeout` (seconds): the request's deadline (also header `X-Request-Timeout`).
- response `teamtr` object: conversation id, the per-role adapter versions the episode ran on, the turns,
  the sampling settings each role used; with `n > 1`, `choices` holds the same for every choice.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Fields a client may send with a value that asks for nothing; any other value is refused.
NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
    "logprobs": (False,),
    "top_logprobs": (0,),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "logit_bias": ({},),
    "tools": ([],),
    "functions": ([],),
    "store": (False,),
    "parallel_tool_calls": (True, False),  # says how tools may be called; without tools, nothing
    "modalities": (["text"],),
    "refusal": (None,),  # an assistant message echoed back from an OpenAI response
    "tool_calls": ([],),
    "annotations": ([],),
}


def _drop_unasked(data: Any, declared: dict[str, Any]) -> Any:
    """Undeclared keys whose value asks for nothing (null or neutral) are dropped; others stay, so
    `extra="forbid"` refuses them by name."""
    if not isinstance(data, dict):
        return data
    return {
        k: v
        for k, v in data.items()
        if k in declared
        or not (v is None or any(v == n and type(v) is type(n) for n in NEUTRAL_VALUES.get(k, ())))
    }


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)

    @model_validator(mode="before")
    @classmethod
    def _unasked(cls, data: Any) -> Any:
        return _drop_unasked(data, cls.model_fields)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False
    include_turns: bool = Field(False, description="teamtr extension: stream each agent turn as it ends")


class RequestMetadata(BaseModel):
    """teamtr reads one key; any other would be ignored, so it is refused."""

    model_config = ConfigDict(extra="forbid")

    conversation_id: str | None = Field(None, max_length=256, description="groups requests (feedback)")


class ChatCompletionRequest(BaseModel):
    """Sampling fields apply to every role's turns, except what the team pins (docs/serving.md)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, description="the name of a team (see GET /v1/models)")
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1, description="cap on each agent turn's new tokens")
    max_completion_tokens: int | None = Field(None, ge=1, description="same as max_tokens")
    temperature: float | None = Field(None, ge=0, le=2, description="every role's temperature")
    top_p: float | None = Field(None, gt=0, le=1, description="every role's nucleus mass")
    stop: str | list[Annotated[str, Field(min_length=1, max_length=64)]] | None = Field(
        None, max_length=4, description="up to 4 strings that end any role's turn (added to the role's own)"
    )
    n: int | None = Field(1, ge=1, le=64, description="episodes to run, one choice each")
    seed: int | None = Field(
        None, ge=-(2**63), le=2**63 - 1, description="same seed, same request, same versions: same answer"
    )
    timeout: float | None = Field(None, gt=0, le=86_400, description="teamtr: deadline in seconds")
    user: str | None = Field(None, max_length=256, description="recorded nowhere; accepted for clients")
    metadata: RequestMetadata | None = None

    @model_validator(mode="before")
    @classmethod
    def _unasked(cls, data: Any) -> Any:
        return _drop_unasked(data, cls.model_fields)

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, str) and not stop:
            raise ValueError("a stop string must not be empty")
        return stop

    @field_validator("messages")
    @classmethod
    def _last_message_is_a_task(cls, messages: list[ChatMessage]) -> list[ChatMessage]:
        if messages[-1].role != "user":
            raise ValueError("the last message must be the user's (it is the team's task)")
        if not messages[-1].text().strip():
            raise ValueError("the last user message is empty")
        return messages

    def turn_token_cap(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    name: str | None = None


class Choice(BaseModel):
    index: int = 0
    message: ResponseMessage
    finish_reason: str
    logprobs: None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TurnInfo(BaseModel):
    """One agent turn as the API shows it (teamtr extension)."""

    index: int
    role: str
    adapter: str | None
    adapter_version: int
    text: str
    prompt_tokens: int
    completion_tokens: int


class RoleSampling(BaseModel):
    """The settings a role's turns were sampled with (after the request and the team's pins)."""

    temperature: float
    top_p: float
    max_tokens: int
    stop: list[str]


class ChoiceInfo(BaseModel):
    index: int
    adapter_versions: dict[str, int]
    turns: list[TurnInfo]


class TeamInfo(BaseModel):
    conversation_id: str
    adapter_versions: dict[str, int]
    turns: list[TurnInfo]
    sampling: dict[str, RoleSampling] = Field(default_factory=dict)
    choices: list[ChoiceInfo] | None = None  # with n > 1: every choice's versions and turns


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[Choice]
    usage: Usage
    teamtr: TeamInfo


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: str | None = None
    logprobs: None = None


class TokenPiece(BaseModel):
    """teamtr extension (`stream_options.include_turns`): a piece of a turn's text as it is decoded."""

    index: int  # the turn's index, as in `teamtr_turn`
    role: str
    text: str


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    teamtr_turn: TurnInfo | None = None
    teamtr_token: TokenPiece | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "teamtr"
    roles: list[str] = Field(default_factory=list)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


REWARD_BOUND = 1000.0  # |reward| of /v1/feedback; a server may declare a narrower range (reward_range)


class FeedbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    conversation_id: str = Field(min_length=1, max_length=256)
    reward: float = Field(
        ge=-REWARD_BOUND,
        le=REWARD_BOUND,
        allow_inf_nan=False,
        description="the episode's reward for training (within the server's reward_range)",
    )
    comment: str | None = Field(None, max_length=4096)


class FeedbackResponse(BaseModel):
    conversation_id: str
    reward: float
    episodes: int = Field(description="episodes of this conversation the reward applies to")


class HealthResponse(BaseModel):
    status: Literal["ok"] = "ok"
    teams: list[str]
    adapters: dict[str, int]
    in_flight: int


class LiveResponse(BaseModel):
    status: Literal["ok"] = "ok"


class ReadyResponse(BaseModel):
    status: Literal["ready", "not_ready"]
    reasons: list[str] = Field(default_factory=list)  # why not ready (empty when ready)


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return ErrorResponse(error=ErrorBody(message=message, type=type_, param=param, code=code)).model_dump()
