"""A langchain-core chat model over a teamtr engine that records what training needs.

Each call renders the messages with the tokenizer's chat template, samples from the engine with the
role's adapter, and returns an AIMessage whose `response_metadata["teamtr"]` holds the prompt token ids,
completion token ids, behaviour log-probs and adapter version: the turn exactly as it was sampled.
`turn_from_reply` turns such a reply back into a `Turn` (episode capture, graphs/capture.py, and
serving's turn spans both read replies through it).

Tools: `bind_tools` (LangChain tools, pydantic models, functions or OpenAI tool dicts) renders the tools
into the prompt (graphs/chat_format.py) and parses the completion's `<tool_call>` blocks into
`AIMessage.tool_calls` / `invalid_tool_calls` (graphs/tool_calls.py), so LangGraph's `ToolNode` and
`tools_condition` work around it unchanged; the `Turn` records both kinds of call.

Inside a captured episode (graphs/capture.py `EpisodeCapture` among the call's callback handlers) the
model samples with the episode's pinned adapter version for its role and with the episode's per-call
seed, so the graph code itself passes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import replace
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage, SystemMessage
from langchain_core.outputs import ChatGeneration, ChatResult, LLMResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict

from teamtr.graphs.chat_format import ChatFormat, render_prompt_ids
from teamtr.graphs.engine import DEFAULT_BASE, Engine, SamplingParams, streams_tokens
from teamtr.graphs.tool_calls import call_id, parse_tool_calls
from teamtr.graphs.trajectory import Turn

METADATA_KEY = "teamtr"
# The episode being captured in this context (graphs/capture.py `run_episode` sets it): how a call whose
# node passed callbacks of its own, which replace the inherited ones, still reaches its episode.
active_episode: ContextVar[Any] = ContextVar("teamtr_active_episode", default=None)


class EngineChatModel(BaseChatModel):
    """`BaseChatModel` backed by an `Engine` (embedded or vLLM) and one LoRA adapter.

    `role` names the role it speaks for (graphs/role_models.py `RoleModels.model` sets it); without it
    the role comes from the call's `teamtr_role` metadata (graphs/team.py sets that).
    Per call, `engine_adapter=` overrides the adapter (serving pins a version this way, e.g.
    `solver@v4`) and `adapter_version=` the version recorded for it; a captured episode's
    `adapter_pins` do the same for the role without any keyword.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    engine: Any  # Engine
    adapter: str | None = None
    base_model: str = DEFAULT_BASE
    sampling: SamplingParams = SamplingParams()
    chat_format: ChatFormat | None = None  # None: ChatFormat() (graphs/chat_format.py)
    role: str | None = None
    # the role's system prompt, sent first when a call's messages have no system message of their own
    # (graphs/role_models.py sets it from the Role; None or "" = messages are sent as given)
    system_prompt: str | None = None

    @property
    def _llm_type(self) -> str:
        return "teamtr-engine"

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """This model with `tools` in every prompt and its completions' calls parsed.

        The model samples freely, so it can neither be forced to call a tool nor kept from one:
        `tool_choice` must be None or "auto"; anything else raises ValueError."""
        if tool_choice not in (None, "auto"):
            raise ValueError(
                f"tool_choice={tool_choice!r}: EngineChatModel samples freely and cannot force or forbid a "
                "tool call; use tool_choice=None or 'auto' (and say in the prompt which tool to call)"
            )
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"role": self.role, "adapter": self.adapter, "base_model": self.base_model}

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
            # the sync run manager has what _agenerate reads of it (handlers, metadata, run_id)
            return asyncio.run(self._agenerate(messages, stop=stop, run_manager=run_manager, **kwargs))  # type: ignore[arg-type]
        raise RuntimeError("EngineChatModel.invoke inside a running event loop: use `await ainvoke`")

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        engine: Engine = self.engine
        role = self.role or (run_manager.metadata.get("teamtr_role") if run_manager is not None else None)
        episode = episode_of(run_manager)
        stray = episode is None and run_manager is not None and active_episode.get() is not None
        if stray:  # the capture never heard of this call: report its start and end to it ourselves
            episode = active_episode.get()
            episode.on_chat_model_start(
                None, [messages], run_id=run_manager.run_id, metadata=run_manager.metadata
            )
        if episode is not None and "engine_adapter" not in kwargs:
            pin = episode.pin(role)
            if pin is not None:  # this episode keeps the adapter version it started with
                kwargs.update(engine_adapter=pin[0], adapter_version=pin[1], adapter_label=self.adapter)
        if episode is not None and "seed" not in kwargs and run_manager is not None:
            seed = episode.call_seed(run_manager.run_id)
            if seed is not None:
                kwargs["seed"] = seed
        adapter = kwargs.get("engine_adapter", self.adapter)
        sampling = self.sampling
        if stop:
            sampling = replace(sampling, stop=tuple(sampling.stop) + tuple(stop))
        if "seed" in kwargs:
            sampling = replace(sampling, seed=kwargs["seed"])
        tools = kwargs.get("tools") or None
        tokenizer = engine.tokenizer(self.base_model)
        messages = with_system_prompt(messages, self.system_prompt)
        prompt_ids = render_prompt_ids(tokenizer, messages, self.chat_format, tools)
        if wants_tokens(run_manager) and streams_tokens(engine):
            gen = await _generate_streaming(engine, run_manager, prompt_ids, adapter, sampling, self.base_model)
        else:
            gen = await engine.generate(prompt_ids, adapter=adapter, sampling=sampling, base=self.base_model)
        version = kwargs.get("adapter_version", gen.adapter_version)
        content = strip_stop(gen.text, sampling.stop)
        calls: dict[str, Any] = {}
        if tools:  # only a model given tools calls them: without, the text is a plain message
            content, valid, invalid = parse_tool_calls(
                content, lambda k: call_id(gen.prompt_ids, gen.completion_ids, k)
            )
            calls = {"tool_calls": valid, "invalid_tool_calls": invalid}
        message = AIMessage(
            content=content,
            **calls,
            response_metadata={
                "finish_reason": gen.finish_reason,
                "model_name": adapter or self.base_model,
                METADATA_KEY: {
                    "role": role,
                    "adapter": kwargs.get("adapter_label", adapter),
                    "adapter_version": version,
                    "base_model": self.base_model,
                    "prompt_ids": gen.prompt_ids,
                    "completion_ids": gen.completion_ids,
                    "logprobs": gen.logprobs,
                    # what the log-probs are: sampled at this temperature / top_p (graphs/trajectory.py)
                    "temperature": sampling.temperature if gen.temperature is None else gen.temperature,
                    "top_p": sampling.top_p if gen.top_p is None else gen.top_p,
                    "text": gen.text,
                },
            },
            usage_metadata={
                "input_tokens": len(gen.prompt_ids),
                "output_tokens": len(gen.completion_ids),
                "total_tokens": len(gen.prompt_ids) + len(gen.completion_ids),
            },
        )
        result = ChatResult(generations=[ChatGeneration(message=message)])
        if stray:
            episode.on_llm_end(LLMResult(generations=[result.generations]), run_id=run_manager.run_id)
        return result


def with_system_prompt(messages: list[BaseMessage], system_prompt: str | None) -> list[BaseMessage]:
    """`messages` with `system_prompt` first when it is set and none of them is a system message."""
    if not system_prompt or any(isinstance(m, SystemMessage) for m in messages):
        return messages
    return [SystemMessage(system_prompt), *messages]


def wants_tokens(run_manager: Any) -> bool:
    """Whether a handler of the call asked for its tokens as they are decoded (`wants_tokens = True`,
    e.g. serving/episodes.py `TurnRecorder` when a stream is open); only then does the engine stream."""
    return any(getattr(h, "wants_tokens", False) for h in getattr(run_manager, "handlers", None) or ())


async def _generate_streaming(
    engine: Any,
    run_manager: AsyncCallbackManagerForLLMRun,
    prompt_ids: list[int],
    adapter: str | None,
    sampling: SamplingParams,
    base: str,
) -> Any:
    """`engine.generate` with each decoded piece of text sent to the call's handlers
    (`on_llm_new_token`) in order, as it comes; the engine may call back from its decoding thread."""
    loop = asyncio.get_running_loop()
    pieces: asyncio.Queue[str | None] = asyncio.Queue()

    def on_token(piece: str) -> None:
        loop.call_soon_threadsafe(pieces.put_nowait, piece)

    async def forward() -> None:
        while (piece := await pieces.get()) is not None:
            await run_manager.on_llm_new_token(piece)

    forwarder = asyncio.create_task(forward())
    try:
        gen = await engine.generate(prompt_ids, adapter=adapter, sampling=sampling, base=base, on_token=on_token)
        # pieces scheduled from the decoding thread ran before generate's result reached us: None is last
        pieces.put_nowait(None)
        await forwarder
    finally:
        if not forwarder.done():
            forwarder.cancel()
            await asyncio.gather(forwarder, return_exceptions=True)
    return gen


def episode_of(run_manager: Any) -> Any | None:
    """The episode capture (graphs/capture.py `EpisodeCapture`) among a call's callback handlers, if any.

    Found by a marker attribute, not by class, because graphs/capture.py imports this module."""
    for handler in getattr(run_manager, "handlers", None) or ():
        if getattr(handler, "is_teamtr_episode", False):
            return handler
    return None


def is_engine_reply(reply: BaseMessage) -> bool:
    """Whether the reply came from an `EngineChatModel`, i.e. carries the turn's tokens and log-probs."""
    return METADATA_KEY in reply.response_metadata


def turn_from_reply(
    reply: BaseMessage,
    role: str,
    adapter: str | None = None,
    base_model: str = DEFAULT_BASE,
    node: str | None = None,
    step: int | None = None,
) -> Turn:
    """The `Turn` of one role's reply.

    An engine reply gives the turn exactly as sampled (its own adapter, version, base and tokens); any
    other chat model's reply gives the text only, attributed to `adapter` (version 0) and `base_model`,
    with no tokens: nothing to train on."""
    meta = reply.response_metadata.get(METADATA_KEY)
    calls = tool_calls_of(reply)
    if meta is None:
        return Turn(
            role=role,
            adapter=adapter,
            adapter_version=0,
            prompt_ids=[],
            completion_ids=[],
            logprobs=[],
            text=str(reply.content),
            base_model=base_model,
            node=node,
            step=step,
            **calls,
        )
    return Turn(
        role=role,
        adapter=meta["adapter"],
        adapter_version=meta["adapter_version"],
        prompt_ids=list(meta["prompt_ids"]),
        completion_ids=list(meta["completion_ids"]),
        logprobs=list(meta["logprobs"]),
        text=meta["text"],
        base_model=meta["base_model"],
        temperature=meta.get("temperature"),
        top_p=meta.get("top_p"),
        node=node,
        step=step,
        **calls,
    )


def tool_calls_of(reply: BaseMessage) -> dict[str, list[dict[str, Any]]]:
    """A reply's valid and invalid tool calls in `Turn`'s shape (graphs/trajectory.py)."""
    valid = [
        {"name": c["name"], "arguments": c["args"], "id": c.get("id")} for c in getattr(reply, "tool_calls", ())
    ]
    invalid = [
        {"name": c.get("name"), "arguments": c.get("args"), "id": c.get("id"), "error": c.get("error")}
        for c in getattr(reply, "invalid_tool_calls", ())
    ]
    return {"tool_calls": valid, "invalid_tool_calls": invalid}


def strip_stop(text: str, stop: tuple[str, ...]) -> str:
    """The message text without the stop string that ended it (the tokens keep it)."""
    for s in stop:
        i = text.find(s)
        if i >= 0:
            return text[:i]
    return text
