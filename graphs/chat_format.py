"""LangChain messages -> the token ids an engine samples from, through the tokenizer's chat template.

The same function renders contexts for rollouts, for the trainer's scoring and for warm-start data,
so the ids a role acted on are exactly the ids it is trained on.

A team context (graphs/roles.py `role_messages`) is: the acting role's system prompt, the task as a user
turn, then the transcript: other roles' messages as user turns carrying the author's `name`, the acting
role's own earlier messages as assistant turns. Real chat templates differ in what they keep, so the
template is probed once (`template_traits`) and the context adapted (`ChatFormat`):

- a template that drops `name` (SmolLM2's ChatML, Llama 3, ...): other roles' messages get the author
  written into the text, "adder1: 10+9+5" (authorship "auto" or "prefix"); the role's own messages stay
  unprefixed assistant turns, as it wrote them;
- a template that renders `name`, or one that renders no roles at all (a plain-text format such as the
  demo character model's): messages are passed as they are (authorship "auto" or "native");
- a template that forbids or drops a system message: the system prompt opens the first user turn;
- a template that requires strict user/assistant alternation: consecutive turns of one role are merged;
- `template_kwargs` (e.g. `enable_thinking=False`) go to `apply_chat_template` as they are.

Tools (graphs/tool_calls.py holds the call convention; docs/graphs.md "Tools"): an AI message's
`tool_calls` and a `ToolMessage`'s `tool_call_id` reach the template in the OpenAI / Hugging Face shape.
A template that renders the `tools=` argument (found by the same probing) gets the tools, the calls and
the tool results natively; one that does not gets the documented text format: a "# Tools" section in
the system prompt, each call written after the message as `<tool_call>{json}</tool_call>` and each
result as `<tool_response>...</tool_response>` in a `tool` turn (a user turn where `tool` is refused).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.messages import BaseMessage

from teamtr.graphs.tool_calls import format_tool_call, tool_response_text, tools_system_section

_ROLE_OF = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}
Authorship = Literal["auto", "native", "prefix"]


class ChatTemplateError(ValueError):
    """A model's chat template cannot render a team's context; the message names the model."""


@dataclass(frozen=True)
class ChatFormat:
    """How a team's context goes through a model's chat template (one per team: Team.from_engine).

    authorship: auto    prefix other roles' messages with their author when the template drops `name`
                        but renders roles; leave them as they are otherwise
                native  never prefix (the template's own handling of `name` is trusted)
                prefix  always prefix (e.g. to train on one format across templates)
    name_prefix: how the author is written before another role's message.
    template_kwargs: extra variables for the template, e.g. {"enable_thinking": False}.
    """

    authorship: Authorship = "auto"
    name_prefix: str = "{name}: "
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.authorship not in ("auto", "native", "prefix"):
            raise ValueError(f"authorship {self.authorship!r}: use auto, native or prefix")
        if "{name}" not in self.name_prefix:
            raise ValueError("name_prefix must contain {name}")


DEFAULT_FORMAT = ChatFormat()


@dataclass(frozen=True)
class TemplateTraits:
    """What a chat template does with a team's context, found by rendering probes."""

    renders_roles: bool  # user and assistant turns render differently
    renders_names: bool  # a message's `name` appears in the output
    system: Literal["rendered", "dropped", "refused"]
    strict_alternation: bool  # two user turns in a row are refused
    # tools (defaults: what a template without tool support does)
    renders_tools: bool = False  # the `tools=` argument changes the text and names the tool
    renders_tool_calls: bool = False  # an assistant message's `tool_calls` appear in the text
    tool_role: Literal["rendered", "dropped", "refused"] = "refused"  # a `tool` message's content

    @property
    def native_tools(self) -> bool:
        """Tools, calls and results all go through the template itself."""
        return self.renders_tools and self.renders_tool_calls and self.tool_role == "rendered"


def to_chat_dicts(messages: list[BaseMessage]) -> list[dict[str, Any]]:
    """Messages as chat-template dicts ({"role", "content"[, "name"][, "tool_calls"][, "tool_call_id"]}),
    nothing adapted. Tool calls take the OpenAI / Hugging Face shape, arguments as a dict."""
    out = []
    for m in messages:
        if m.type not in _ROLE_OF:
            raise ValueError(f"unsupported message type {m.type!r}")
        d: dict[str, Any] = {"role": _ROLE_OF[m.type], "content": m.text if hasattr(m, "text") else str(m.content)}
        if getattr(m, "name", None):
            d["name"] = m.name
        calls = getattr(m, "tool_calls", None) if m.type == "ai" else None
        if calls:
            d["tool_calls"] = [
                {"id": c.get("id"), "type": "function", "function": {"name": c["name"], "arguments": c["args"]}}
                for c in calls
            ]
        if m.type == "tool":
            d["tool_call_id"] = m.tool_call_id
        out.append(d)
    return out


def _model_name(tokenizer: Any) -> str:
    return getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__


def _render(tokenizer: Any, dicts: list[dict[str, Any]], kwargs: Mapping[str, Any], generation: bool = True) -> str:
    return tokenizer.apply_chat_template(dicts, add_generation_prompt=generation, tokenize=False, **kwargs)


def _try_render(tokenizer: Any, dicts: list[dict[str, Any]], kwargs: Mapping[str, Any]) -> str | None:
    try:
        return _render(tokenizer, dicts, kwargs, generation=False)
    except Exception:  # jinja's raise_exception, or a template error: this shape is refused
        return None


_TRAITS: dict[tuple, TemplateTraits] = {}


def template_traits(tokenizer: Any, template_kwargs: Mapping[str, Any] | None = None) -> TemplateTraits:
    """Probe the tokenizer's chat template (cached per template text and keyword arguments)."""
    kwargs = dict(template_kwargs or {})
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise ChatTemplateError(
            f"model {_model_name(tokenizer)!r} has no chat template: give its tokenizer one "
            "(tokenizer.chat_template = '...', saved with save_pretrained)"
        )
    key = (str(template), repr(sorted(kwargs.items())), getattr(tokenizer, "bos_token", None))
    if key in _TRAITS:
        return _TRAITS[key]
    marker, author = "Zq7probe", "Authorzq"
    task = {"role": "user", "content": "Xk5task"}
    as_assistant = _try_render(tokenizer, [task, {"role": "assistant", "content": marker}], kwargs)
    as_user = _try_render(tokenizer, [task, {"role": "user", "content": marker}], kwargs)
    named = _try_render(tokenizer, [task, {"role": "assistant", "content": marker, "name": author}], kwargs)
    with_system = _try_render(tokenizer, [{"role": "system", "content": marker}, task], kwargs)
    if as_assistant is None or named is None:
        raise ChatTemplateError(
            f"model {_model_name(tokenizer)!r}: its chat template cannot render a user turn followed by an "
            "assistant turn, which every team context needs; fix the template or use another model"
        )
    renders_tools, renders_tool_calls, tool_role = _tool_traits(tokenizer, kwargs)
    traits = TemplateTraits(
        renders_roles=as_user is None or as_user != as_assistant,
        renders_names=author in named,
        system="refused" if with_system is None else ("rendered" if marker in with_system else "dropped"),
        strict_alternation=as_user is None,
        renders_tools=renders_tools,
        renders_tool_calls=renders_tool_calls,
        tool_role=tool_role,
    )
    # a whole team context, adapted, must render: otherwise fail now, not at a role's first turn
    sample = [
        {"role": "system", "content": "s"},
        task,
        {"role": "user", "content": "m1", "name": "other"},
        {"role": "assistant", "content": "m2", "name": "self"},
        {"role": "user", "content": "m3", "name": "other"},
        {"role": "user", "content": "m4", "name": "third"},
    ]
    try:
        _render(tokenizer, _adapt(sample, traits, DEFAULT_FORMAT), kwargs)
    except Exception as e:
        raise ChatTemplateError(
            f"model {_model_name(tokenizer)!r}: its chat template cannot render a team's context even "
            f"adapted to it ({e}); give the tokenizer another template"
        ) from e
    _TRAITS[key] = traits
    return traits


_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "Toolzq9probe",
        "description": "probe",
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
    },
}


def _tool_traits(tokenizer: Any, kwargs: Mapping[str, Any]) -> tuple[bool, bool, Literal["rendered", "dropped", "refused"]]:
    """(renders `tools=`, renders an assistant's `tool_calls`, what it does with a `tool` message)."""
    name = _PROBE_TOOL["function"]["name"]
    task = [{"role": "user", "content": "Xk5task"}]
    plain = _try_render(tokenizer, task, kwargs)
    with_tools = _try_render(tokenizer, task, {**kwargs, "tools": [_PROBE_TOOL]})
    renders_tools = with_tools is not None and with_tools != plain and name in with_tools
    call = {"id": "call_zq", "type": "function", "function": {"name": name, "arguments": {"x": "Argzq"}}}
    called = _try_render(tokenizer, [*task, {"role": "assistant", "content": "", "tool_calls": [call]}], kwargs)
    renders_tool_calls = called is not None and name in called and "Argzq" in called
    result = {"role": "tool", "content": "Resultzq", "tool_call_id": "call_zq", "name": name}
    answered = _try_render(
        tokenizer, [*task, {"role": "assistant", "content": "", "tool_calls": [call]}, result], kwargs
    ) or _try_render(tokenizer, [*task, {"role": "assistant", "content": "a"}, result], kwargs)
    tool_role: Literal["rendered", "dropped", "refused"] = (
        "refused" if answered is None else ("rendered" if "Resultzq" in answered else "dropped")
    )
    return renders_tools, renders_tool_calls, tool_role


def adapt_chat_dicts(
    tokenizer: Any,
    messages: list[BaseMessage],
    chat_format: ChatFormat | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The dicts the template renders: authorship written in where needed, tools, tool calls and tool
    results in the text format where the template has no native support, the system prompt folded
    into the first user turn where the template has none, same-role turns merged where it alternates."""
    fmt = chat_format or DEFAULT_FORMAT
    traits = template_traits(tokenizer, fmt.template_kwargs)
    return _adapt(_adapt_tools(to_chat_dicts(messages), traits, tools), traits, fmt)


def _adapt_tools(
    dicts: list[dict[str, Any]], traits: TemplateTraits, tools: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """Tools, calls and results as text (docs/graphs.md "Tools") unless the template renders them all."""
    if traits.native_tools:
        return dicts
    out: list[dict[str, Any]] = []
    for d in dicts:
        d = dict(d)
        calls = d.pop("tool_calls", None)
        if calls:  # written after the message's text, exactly as the model writes a call
            written = "\n".join(format_tool_call(c["function"]["name"], c["function"]["arguments"]) for c in calls)
            d["content"] = f"{d['content']}\n{written}" if d["content"] else written
        if d["role"] == "tool":
            d.pop("tool_call_id", None)
            d.pop("name", None)  # not an author: the wrapper says what it is
            d["content"] = tool_response_text(d["content"])
            if traits.tool_role != "rendered":
                d["role"] = "user"
        out.append(d)
    if tools:
        section = tools_system_section(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{section}"}
        else:
            out.insert(0, {"role": "system", "content": section})
    return out


def _adapt(dicts: list[dict[str, Any]], traits: TemplateTraits, fmt: ChatFormat) -> list[dict[str, Any]]:
    dicts = [dict(d) for d in dicts]
    prefix = fmt.authorship == "prefix" or (
        fmt.authorship == "auto" and traits.renders_roles and (not traits.renders_names or traits.strict_alternation)
    )
    if prefix:  # another role's message: a named user turn (graphs/roles.py)
        for d in dicts:
            if d["role"] == "user" and d.get("name"):
                d["content"] = fmt.name_prefix.format(name=d["name"]) + d["content"]
    if traits.system != "rendered":
        system = [d["content"] for d in dicts if d["role"] == "system"]
        dicts = [d for d in dicts if d["role"] != "system"]
        if system:
            text = "\n\n".join(system)
            if dicts and dicts[0]["role"] == "user":
                dicts[0] = {**dicts[0], "content": f"{text}\n\n{dicts[0]['content']}"}
            else:
                dicts.insert(0, {"role": "user", "content": text})
    if traits.strict_alternation:
        merged: list[dict[str, Any]] = []
        for d in dicts:
            if merged and merged[-1]["role"] == d["role"]:
                merged[-1] = {**merged[-1], "content": f"{merged[-1]['content']}\n\n{d['content']}"}
            else:
                merged.append(dict(d))
        dicts = merged
    return dicts


def render_prompt(
    tokenizer: Any,
    messages: list[BaseMessage],
    chat_format: ChatFormat | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """The context's text with the generation prompt appended; `tools` (OpenAI tool dicts) through the
    template's `tools=` where it renders them, else in the system prompt (`_adapt_tools`)."""
    fmt = chat_format or DEFAULT_FORMAT
    dicts = adapt_chat_dicts(tokenizer, messages, fmt, tools)
    kwargs = dict(fmt.template_kwargs)
    if tools and template_traits(tokenizer, fmt.template_kwargs).native_tools:
        kwargs["tools"] = tools
    try:
        return _render(tokenizer, dicts, kwargs)
    except Exception as e:
        roles = " -> ".join(d["role"] for d in dicts)
        raise ChatTemplateError(
            f"model {_model_name(tokenizer)!r}: its chat template refused this context ({roles}): {e}; "
            "set the team's ChatFormat (graphs/chat_format.py) or give the tokenizer another template"
        ) from e


def render_prompt_ids(
    tokenizer: Any,
    messages: list[BaseMessage],
    chat_format: ChatFormat | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """Token ids of the context with the generation prompt appended (the engine continues from here)."""
    text = render_prompt(tokenizer, messages, chat_format, tools)
    return tokenizer(text, add_special_tokens=False)["input_ids"]
