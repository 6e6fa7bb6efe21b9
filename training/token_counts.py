"""What a run's training costs, counted three ways (docs/training.md "Token counts").

1. generated: completion tokens sampled for training (`RunState.train_tokens`);
2. uncached prefill: prompt tokens of those sampled turns that an engine with automatic prefix caching
   would still have to prefill (`PrefixCache` below; `RunState.train_prefill_tokens`);
3. everything processed: 1 + 2 + the tokens of every log-prob pass of the updates (the step's
   pi_old scoring, its epochs, its KL checks and backtracks; `RunState.train_pass_tokens`).

Suffix resampling regenerates only what an update made stale, so the three counts give three different
ratios of TeamTR's cost over a stale schedule's: count 1 the largest, count 3 the smallest.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from teamtr.graphs.trajectory import Turn


class PrefixCache:
    """vLLM's automatic prefix caching with unbounded memory, at token (not block) granularity: the KV of
    a sequence processed under one adapter version serves any later prompt under that same version that
    starts with it. A lower bound on a real engine's prefill (blocks of 16 tokens, eviction).

    A role's update makes a new version, whose cache starts empty: the old version's tokens are dropped
    (no later call can use them). In memory only: a resumed run's cache starts empty."""

    def __init__(self) -> None:
        # (base model, adapter) -> (version, trie of processed token sequences: token -> child)
        self._tries: dict[tuple[str, str | None], tuple[int, dict[int, dict]]] = {}

    def prefill(self, turn: Turn) -> int:
        """The prompt tokens of a freshly sampled `turn` that no cached sequence covers; the turn's
        prompt and completion are cached afterwards."""
        key = (turn.base_model, turn.adapter)
        version, root = self._tries.get(key, (None, None))
        if root is None or version != turn.adapter_version:
            root = {}
            self._tries[key] = (turn.adapter_version, root)
        node, hit = root, 0
        for token in turn.prompt_ids:
            child = node.get(token)
            if child is None:
                break
            node, hit = child, hit + 1
        node = root
        for token in (*turn.prompt_ids, *turn.completion_ids):
            node = node.setdefault(token, {})
        return len(turn.prompt_ids) - hit

    def sampled(self, turns: Iterable[Turn]) -> int:
        """Uncached prefill of freshly sampled turns, in the order given (a group's first episode
        prefills the shared prompt, the others hit it)."""
        return sum(self.prefill(t) for t in turns if t.completion_ids)


def pass_tokens(prompts: list[list[int]], completions: list[list[int]]) -> int:
    """Tokens one log-prob pass over these messages runs through the model (context and message)."""
    return sum(len(p) + len(c) for p, c in zip(prompts, completions, strict=True))


def three_counts(record: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """Counts 1, 2 and 3 of a run summary, stage or update record (each includes the one before it);
    None for a record written before counts 2 and 3 existed."""
    if record.get("train_prefill_tokens") is None:
        return None
    generated = record["train_tokens"]
    prefilled = generated + record["train_prefill_tokens"]
    return generated, prefilled, prefilled + record["train_pass_tokens"]
