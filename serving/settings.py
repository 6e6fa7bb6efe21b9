"""Limits and keys of one server (cli/serve.py builds them from a `ServeConfig`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ServeSettings:
    """Defaults: an open chat API, admin endpoints off (no admin key)."""

    api_keys: tuple[str, ...] = ()  # Bearer keys accepted by the chat API; empty = no key needed
    admin_key: str | None = None  # Bearer key of the /admin endpoints; None = they answer 403
    max_body_bytes: int = 1_000_000  # larger request bodies get 413
    max_prompt_tokens: int = 256  # the task (with folded context) in tokens; longer gets 400
    max_tokens_limit: int = 4096  # a request's max_tokens above this gets 400
    max_conversations: int = 100_000  # conversation ids remembered for /v1/feedback
