"""Small helpers shared by the task families: where a final answer sits in a message, seeded rngs."""

from __future__ import annotations

import hashlib
import random


def last_line(response: str) -> str | None:
    """The last non-empty line of a message, stripped; None for an empty message."""
    lines = [line.strip() for line in response.strip().splitlines() if line.strip()]
    return lines[-1] if lines else None


def seeded_rng(*parts: object) -> random.Random:
    """A Random whose stream depends only on `parts` (never on PYTHONHASHSEED or the process)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def check_knobs(family: str, given: dict, allowed: set[str]) -> None:
    """A clear error for a misspelt difficulty knob instead of silently ignoring it."""
    unknown = set(given) - allowed
    if unknown:
        raise ValueError(f"{family}: unknown difficulty knob(s) {sorted(unknown)}; known: {sorted(allowed)}")


def instance_id(family: str, seed: int, index: int, knobs: object) -> str:
    """Unique across difficulty settings too: `zebra-7-0-3x2` (family, seed, index, knob values)."""
    values = "x".join(str(v) for v in vars(knobs).values())
    return f"{family}-{seed}-{index}-{values}"
