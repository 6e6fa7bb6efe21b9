"""The engine interface shared by training rollouts and serving.

Two implementations: `EmbeddedEngine` (transformers + peft, in process) and `VLLMEngine` (a real vLLM
OpenAI-compatible server with runtime LoRA). A role's chat model, the trainer's rollouts and the chat
API all talk to an engine through this interface only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

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
