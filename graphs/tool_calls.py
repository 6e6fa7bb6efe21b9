"""The tool-call convention of teamtr's chat models: how a call is written, read back and described.

A model calls a tool by writing, anywhere in its message (Qwen 2.5 / Hermes style):

    <tool_call>
    {"name": "add", "arguments": {"a": 2, "b": 3}}
    </tool_call>

`parse_tool_calls` reads every such block of a completion: a block whose JSON parses to exactly
`{"name": <str>, "arguments": <object>}` becomes a LangChain `ToolCall`; anything else (bad JSON, another
shape, a block never closed) becomes an `InvalidToolCall` with the raw text and the reason, never
repaired, so the trainer sees the mistake. Valid blocks leave the message's text (the template writes
them back from `tool_calls`); invalid ones stay in it as the model wrote them.

For templates without native tool support, graphs/chat_format.py writes the tools into the system
prompt (`tools_system_section`), calls back as these blocks (`format_tool_call`) and results as
`<tool_response>` blocks (`tool_response_text`); docs/graphs.md "Tools" shows the format.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.messages.tool import InvalidToolCall, ToolCall, invalid_tool_call, tool_call

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


def format_tool_call(name: str, arguments: Any) -> str:
    """One call as the model writes it (and as a template without tool support shows it later)."""
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n{CLOSE}"


def tool_response_text(content: str) -> str:
    """A tool's result in a context whose template has no tool support."""
    return f"<tool_response>\n{content}\n</tool_response>"


def tools_system_section(tools: Sequence[dict[str, Any]]) -> str:
    """The "# Tools" section appended to the system prompt where the template has no `tools=`."""
    schemas = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\n"
        "You may call one or more functions. Their signatures, as JSON schemas:\n"
        f"<tools>\n{schemas}\n</tools>\n\n"
        "To call a function, write for each call:\n"
        f'{OPEN}\n{{"name": <function name>, "arguments": <arguments as a JSON object>}}\n{CLOSE}'
    )


def call_id(prompt_ids: Sequence[int], completion_ids: Sequence[int], index: int) -> str:
    """A tool call's id: stable for the same context, completion and position (seeded runs reproduce)."""
    digest = hashlib.blake2b(repr((list(prompt_ids), list(completion_ids), index)).encode(), digest_size=12)
    return f"call_{digest.hexdigest()}"


def _check(block: str) -> tuple[str, dict[str, Any]]:
    """(name, arguments) of a well-formed call; raises ValueError saying what is wrong otherwise."""
    try:
        value = json.loads(block)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e}") from e
    if not isinstance(value, dict) or set(value) != {"name", "arguments"}:
        keys = sorted(value) if isinstance(value, dict) else type(value).__name__
        raise ValueError(f'expected exactly {{"name": ..., "arguments": {{...}}}}, got {keys}')
    if not isinstance(value["name"], str) or not value["name"]:
        raise ValueError(f"name must be a non-empty string, got {value['name']!r}")
    if not isinstance(value["arguments"], dict):
        raise ValueError(f"arguments must be a JSON object, got {type(value['arguments']).__name__}")
    return value["name"], value["arguments"]


def _name_of(block: str) -> str | None:
    """The name a malformed call seems to give, for the InvalidToolCall (never used to repair it)."""
    m = re.search(r'"name"\s*:\s*"([^"]*)"', block)
    return m.group(1) if m else None


def parse_tool_calls(
    text: str, make_id: Callable[[int], str] = lambda k: f"call_{k}"
) -> tuple[str, list[ToolCall], list[InvalidToolCall]]:
    """(the text without its valid calls, valid calls, invalid calls) of one completion.

    `make_id(k)` is the id of the k-th block, valid or not (EngineChatModel: `call_id`)."""
    calls: list[ToolCall] = []
    invalid: list[InvalidToolCall] = []
    kept: list[str] = []
    pos = 0
    k = -1

    def next_id() -> str:
        nonlocal k
        k += 1
        return make_id(k)

    for m in _BLOCK.finditer(text):
        kept.append(text[pos : m.start()])
        pos = m.end()
        raw = m.group(1).strip()
        try:
            name, arguments = _check(raw)
        except ValueError as e:
            invalid.append(invalid_tool_call(name=_name_of(raw), args=raw, id=next_id(), error=str(e)))
            kept.append(m.group(0))
            continue
        calls.append(tool_call(name=name, args=arguments, id=next_id()))
    rest = text[pos:]
    start = rest.find(OPEN)
    if start >= 0:  # opened, never closed (the message ended first)
        raw = rest[start + len(OPEN) :].strip()
        invalid.append(
            invalid_tool_call(name=_name_of(raw), args=raw, id=next_id(), error=f"{OPEN} without {CLOSE}")
        )
    kept.append(rest)
    content = "".join(kept)
    if calls:
        content = content.strip()
    return content, calls, invalid

