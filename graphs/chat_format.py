"""LangChain messages -> the token ids an engine samples from, through the tokenizer's chat template.

The same function renders contexts for rollouts, for the trainer's scoring and for warm-start data,
so the ids a role acted on are exactly the ids it is trained on.
"""

from __future__ import annotations

from langchain_core.messages import BaseMessage

_ROLE_OF = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}


def to_chat_dicts(messages: list[BaseMessage]) -> list[dict[str, str]]:
    out = []
    for m in messages:
        if m.type not in _ROLE_OF:
            raise ValueError(f"unsupported message type {m.type!r}")
        d = {"role": _ROLE_OF[m.type], "content": m.text if hasattr(m, "text") else str(m.content)}
        if getattr(m, "name", None):
            d["name"] = m.name
        out.append(d)
    return out


def render_prompt_ids(tokenizer, messages: list[BaseMessage]) -> list[int]:
    """Token ids of the context with the generation prompt appended (the engine continues from here)."""
    text = tokenizer.apply_chat_template(
        to_chat_dicts(messages), add_generation_prompt=True, tokenize=False
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]
