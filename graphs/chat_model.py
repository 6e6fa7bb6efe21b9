"""A langchain-core chat model over a teamtr engine that records what training needs.

Each call renders the messages with the tokenizer's chat template, samples from the engine with the
role's adapter, and returns an AIMessage whose `response_metadata["teamtr"]` holds the prompt token ids,
completion token ids, behaviour log-probs and adapter version: the turn exactly as it was sampled.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import ConfigDict

from teamtr.graphs.chat_format import ChatFormat, render_prompt_ids
from teamtr.graphs.engine import DEFAULT_BASE, Engine, SamplingParams

METADATA_KEY = "teamtr"


class EngineChatModel(BaseChatModel):
    """`BaseChatModel` backed by an `Engine` (embedded or vLLM) and one LoRA adapter.

    Per call, `engine_adapter=` overrides the adapter (serving pins a version this way, e.g.
    `solver@v4`) and `adapter_version=` the version recorded for it.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    engine: Any  # Engine
    adapter: str | None = None
    base_model: str = DEFAULT_BASE
    sampling: SamplingParams = SamplingParams()
    chat_format: ChatFormat | None = None  # None: ChatFormat() (graphs/chat_format.py)

    @property
    def _llm_type(self) -> str:
        return "teamtr-engine"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"adapter": self.adapter, "base_model": self.base_model}

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self._agenerate(messages, stop=stop, **kwargs))
        raise RuntimeError("EngineChatModel.invoke inside a running event loop: use `await ainvoke`")

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        engine: Engine = self.engine
        adapter = kwargs.get("engine_adapter", self.adapter)
        sampling = self.sampling
        if stop:
            sampling = replace(sampling, stop=tuple(sampling.stop) + tuple(stop))
        if "seed" in kwargs:
            sampling = replace(sampling, seed=kwargs["seed"])
        prompt_ids = render_prompt_ids(engine.tokenizer(self.base_model), messages, self.chat_format)
        gen = await engine.generate(prompt_ids, adapter=adapter, sampling=sampling, base=self.base_model)
        version = kwargs.get("adapter_version", gen.adapter_version)
        message = AIMessage(
            content=_strip_stop(gen.text, sampling.stop),
            response_metadata={
                "finish_reason": gen.finish_reason,
                "model_name": adapter or self.base_model,
                METADATA_KEY: {
                    "adapter": kwargs.get("adapter_label", adapter),
                    "adapter_version": version,
                    "base_model": self.base_model,
                    "prompt_ids": gen.prompt_ids,
                    "completion_ids": gen.completion_ids,
                    "logprobs": gen.logprobs,
                    "text": gen.text,
                },
            },
            usage_metadata={
                "input_tokens": len(gen.prompt_ids),
                "output_tokens": len(gen.completion_ids),
                "total_tokens": len(gen.prompt_ids) + len(gen.completion_ids),
            },
        )
        return ChatResult(generations=[ChatGeneration(message=message)])


def _strip_stop(text: str, stop: tuple[str, ...]) -> str:
    """The message text without the stop string that ended it (the tokens keep it)."""
    for s in stop:
        i = text.find(s)
        if i >= 0:
            return text[:i]
    return text
