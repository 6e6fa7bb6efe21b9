"""The wire format of the team chat API: OpenAI's chat-completions shapes, plus small documented extensions.

Only what the server reads is declared strictly; unknown request fields are accepted and ignored, as
OpenAI-compatible servers do (clients send fields like `tools` or `logit_bias` a team does not use).

Extensions (all opt-in, ignored by plain OpenAI clients):
- request `stream_options.include_turns: true` streams one chunk per agent turn before the answer; the
  chunk has `choices: []` and a `teamtr_turn` object (role, adapter, version, text, token counts).
- request `metadata.conversation_id` groups several requests into one conversation (for feedback and
  traces); by default every request is its own conversation, named by the response `id`.
- response `teamtr` object: conversation id, the per-role adapter versions the episode ran on, the turns.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False
    include_turns: bool = Field(False, description="teamtr extension: stream each agent turn as it ends")


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, description="the name of a team (see GET /v1/models)")
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1, description="cap on each turn's new tokens")
    max_completion_tokens: int | None = Field(None, ge=1, description="alias of max_tokens")
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int | None = Field(1, ge=1, le=1, description="one choice per request")
    seed: int | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None

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


class TeamInfo(BaseModel):
    conversation_id: str
    adapter_versions: dict[str, int]
    turns: list[TurnInfo]


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


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    teamtr_turn: TurnInfo | None = None


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


class FeedbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    conversation_id: str = Field(min_length=1, max_length=256)
    reward: float = Field(allow_inf_nan=False, description="the episode's reward for training")
    comment: str | None = Field(None, max_length=4096)


class FeedbackResponse(BaseModel):
    conversation_id: str
    reward: float
    episodes: int = Field(description="episodes of this conversation the reward applies to")


class AdapterPushRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: str = Field(min_length=1, max_length=128)
    path: str = Field(min_length=1, max_length=4096, description="peft adapter directory on the server")
    version: int | None = Field(None, ge=0, description="default: from a v<N> directory name, or next")


class AdapterRollbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: str = Field(min_length=1, max_length=128)


class AdapterVersionInfo(BaseModel):
    role: str
    version: int
    engine_name: str
    path: str
    live: bool
    in_flight: int
    current: bool


class AdapterListResponse(BaseModel):
    roles: dict[str, list[AdapterVersionInfo]]
    current: dict[str, int]


class HealthResponse(BaseModel):
    status: Literal["ok"] = "ok"
    teams: list[str]
    adapters: dict[str, int]
    in_flight: int


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return ErrorResponse(error=ErrorBody(message=message, type=type_, param=param, code=code)).model_dump()
