"""The engine interface shared by training rollouts and serving.

Implementations (engines/, opened by `open_engine`): `EmbeddedEngine` (transformers + peft, in
process), `VLLMEngine` (a real vLLM OpenAI-compatible server with runtime LoRA), `VLLMReplicaEngine`
(several vLLM servers per base) and training's `VLLMRollouts` (a VLLMEngine that records the trainer's
versions). A role's chat model, the trainer's rollouts and the chat API all talk to an engine through
`Engine` only; what some engines add is declared below as protocols of its own (`TokenStreaming`,
`ServedAdapters`, `RestoresAdapters`, `Closable`) and asked with isinstance, never guessed with getattr.
The trainer needs more of the engine whose adapters it trains (`TrainableEngine`: differentiable log-probs,
the adapters' parameters, their snapshots and versions); `EmbeddedEngine` is the one that has it today.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # graphs/ does not load torch: the trainable-engine protocol only names its types
    import torch

DEFAULT_BASE = "base"
# The attention and MLP projections of Llama/Qwen-style models: what role adapters target by default and
# what the vLLM launcher lets a LoRA touch (not lm_head / embeddings; see docs/vllm.md).
LORA_TARGET_MODULES: tuple[str, ...] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)


@dataclass(frozen=True)
class SamplingParams:
    """How a message is sampled, and which log-probs the engine records for it (`Generation.logprobs`):

    - temperature T > 0, top_p = 1: log softmax(logits / T) of the sampled token, the distribution it was
      drawn from (the behaviour log-prob of pi_T);
    - T > 0, top_p < 1: the same, renormalised over the nucleus the token was drawn from (the smallest
      set of tokens whose pi_T mass reaches top_p);
    - T = 0 (greedy): the log-prob of the untempered policy pi (T = 1), NOT a behaviour log-prob: the
      greedy policy puts probability 1 on the argmax. A Turn's `temperature` of 0 says so, and the
      trainer refuses such turns (training/behaviour.py).
    """

    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    max_new_tokens: int = 32
    stop: tuple[str, ...] = ()  # generation ends after the first of these strings (kept in the text)
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")


@dataclass
class Generation:
    """What an engine returns for one prompt: token ids and their log-probs (of the distribution each token
    was sampled from; see SamplingParams), never re-tokenised."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" or "length"
    adapter: str | None
    adapter_version: int
    base_model: str = DEFAULT_BASE
    extra: dict = field(default_factory=dict)
    # what `logprobs` mean (SamplingParams): the temperature and top_p the tokens were sampled with
    temperature: float | None = None
    top_p: float | None = None


@runtime_checkable
class Engine(Protocol):
    """One or more base models, each with named LoRA adapters (None = the base / reference policy).

    Adapter names are engine-level names. Serving pins versions by loading each version under its own
    name (e.g. `solver@v4`) so in-flight episodes finish on the version they started with; training
    updates one live adapter in place and the engine counts its versions (`adapter_version`).
    """

    def tokenizer(self, base: str = DEFAULT_BASE):  # -> transformers.PreTrainedTokenizerBase
        ...

    def base_models(self) -> list[str]: ...

    def adapter_version(self, adapter: str | None, base: str = DEFAULT_BASE) -> int: ...

    async def generate(
        self,
        prompt_ids: list[int],
        *,
        adapter: str | None,
        sampling: SamplingParams,
        base: str = DEFAULT_BASE,
    ) -> Generation: ...

    async def load_adapter(self, name: str, path: str, base: str = DEFAULT_BASE) -> None:
        """Load (or replace in place) a peft LoRA adapter directory under `name`; bumps its version."""
        ...

    async def unload_adapter(self, name: str, base: str = DEFAULT_BASE) -> None: ...

    def score(
        self,
        prompts: list[list[int]],
        completions: list[list[int]],
        adapter: str | None,
        base: str = DEFAULT_BASE,
    ) -> list[list[float]]:
        """log pi(x_u | prompt, x_<u) of given completion tokens under `adapter` (no sampling)."""
        ...


@runtime_checkable
class TokenStreaming(Protocol):
    """An engine whose `generate` takes `on_token`, called with each piece of text as it is decoded (the
    chat API streams the answer's tokens live through it)."""

    streams_tokens: bool

    async def generate(
        self,
        prompt_ids: list[int],
        *,
        adapter: str | None,
        sampling: SamplingParams,
        base: str = DEFAULT_BASE,
        on_token: Callable[[str], None] | None = None,
    ) -> Generation: ...


@runtime_checkable
class ServedAdapters(Protocol):
    """An engine whose adapters live in servers that may restart and lose them (vLLM): readiness asks
    the servers what they serve, not the engine's records."""

    async def served_models(self, base: str = DEFAULT_BASE) -> list[str]: ...


@runtime_checkable
class RestoresAdapters(Protocol):
    """... and can load again what a restarted server lost (one vLLM server per base)."""

    async def restore_adapters(self, base: str = DEFAULT_BASE) -> list[str]: ...


@runtime_checkable
class Closable(Protocol):
    """An engine holding connections (HTTP clients) to close when its owner stops."""

    async def aclose(self) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class TrainableEngine(Engine, Protocol):
    """An engine whose adapters the trainer (training/) updates in place: what `AdapterPolicy` and the
    stage team ask of it. Any engine implementing this can be trained."""

    def model(self, base: str = DEFAULT_BASE) -> torch.nn.Module:
        """The torch model holding the base's adapters (a peft model): gradients flow through it, and the
        trainer saves adapters from it."""
        ...

    def adapter_parameters(self, name: str, base: str = DEFAULT_BASE) -> dict[str, torch.nn.Parameter]:
        """The parameters of one adapter: what the trainer optimises for that role."""
        ...

    def token_logprobs(
        self,
        prompts: list[list[int]],
        completions: list[list[int]],
        adapter: str | None | list[str | None],
        base: str = DEFAULT_BASE,
        temperature: float = 1.0,
    ) -> list[torch.Tensor]:
        """log pi_T(x_u | prompt, x_<u) of each completion token, differentiable (T = `temperature`)."""
        ...

    def snapshot_adapter(self, name: str, base: str = DEFAULT_BASE) -> dict[str, torch.Tensor]:
        """A copy of the adapter's weights, for `restore_adapter`."""
        ...

    def restore_adapter(self, name: str, snapshot: dict[str, torch.Tensor], base: str = DEFAULT_BASE) -> None:
        """Put exactly these weights back (backtracking a rejected update)."""
        ...

    def commit_adapter_update(self, name: str, base: str = DEFAULT_BASE) -> int:
        """Mark the adapter's current weights live as its next version; returns that version."""
        ...


def streams_tokens(engine: object) -> bool:
    return isinstance(engine, TokenStreaming) and bool(engine.streams_tokens)
