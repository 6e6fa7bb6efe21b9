"""The one schema of a team episode: used by rollouts, the trace store and the trainer alike.

A `Turn` is exactly what the sampling engine produced for one role's message: the prompt token ids it
was conditioned on, the completion token ids it sampled and their behaviour log-probs. Nothing here is
ever re-tokenised from text after the fact.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Turn:
    """One agent message: role j's action m ~ pi_j(.|s) at context s."""

    role: str
    adapter: str | None  # LoRA adapter name the engine sampled with (None = the base model)
    adapter_version: int  # registry version of that adapter when the turn was sampled
    prompt_ids: list[int]  # token ids of the context s as the engine saw it
    completion_ids: list[int]  # token ids of the message m
    logprobs: list[float]  # log-prob of each completion token under the distribution it was sampled from
    text: str  # decoded message text
    base_model: str = "base"  # key of the base model in the engine (heterogeneous teams)
    # How the message was sampled, i.e. what `logprobs` are (graphs/engine.py SamplingParams):
    # T > 0: log softmax(logits / T) (top_p < 1: renormalised over the nucleus), behaviour log-probs;
    # T = 0: greedy, `logprobs` are those of pi at T = 1 and NOT behaviour log-probs.
    # None: unknown (a turn recorded before these fields existed: its log-probs were those of pi at
    # T = 1 whatever the sampling temperature was).
    temperature: float | None = None
    top_p: float | None = None
    # The tool calls the message made (graphs/tool_calls.py): {"name", "arguments", "id"} each, and the
    # malformed ones, {"name" (or None), "arguments" (the raw text), "id", "error"}. Part of the action
    # (they are in its tokens); the tools' results are context of later turns, never trained on.
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    invalid_tool_calls: list[dict[str, Any]] = field(default_factory=list)
    # Where in the graph the call was made: provenance, not part of the action, so turns compare equal
    # without it (a turn rebuilt from a trace span has none).
    node: str | None = field(default=None, compare=False)  # LangGraph node ("sub/inner" in a subgraph)
    step: int | None = field(default=None, compare=False)  # its superstep (a subgraph's own step in one)

    def __post_init__(self) -> None:
        if len(self.completion_ids) != len(self.logprobs):
            raise ValueError(
                f"turn of role {self.role!r}: {len(self.completion_ids)} completion tokens but "
                f"{len(self.logprobs)} log-probs"
            )

    @property
    def is_behaviour_sample(self) -> bool:
        """True when `logprobs` are the log-probs of the distribution the tokens were drawn from at a
        known temperature > 0 (greedy turns and turns of unknown temperature are not)."""
        return self.temperature is not None and self.temperature > 0

    @property
    def logprob_sum(self) -> float:
        """log pi_j(m|s) = sum_u log pi_j(x_u | s, x_<u)."""
        return float(sum(self.logprobs))

    @property
    def trainable(self) -> bool:
        """Whether the turn carries sampled tokens (a foreign chat model's turn is text only)."""
        return bool(self.completion_ids)


@dataclass
class Trajectory:
    """One episode of the team on one task: ordered turns plus the verifier's reward."""

    task_id: str
    turns: list[Turn]
    reward: float = 0.0
    group_id: str = ""  # episodes of the same prompt share a group (group-normalised advantages)
    final_answer: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def turns_of(self, role: str | tuple[str, ...]) -> list[Turn]:
        """The turns of `role`, or of any of several roles (those that speak with one shared adapter)."""
        if isinstance(role, tuple):
            return [t for t in self.turns if t.role in role]
        return [t for t in self.turns if t.role == role]

    def adapter_versions(self) -> dict[str, int]:
        """The adapter version each role acted with (the first turn of the role)."""
        out: dict[str, int] = {}
        for t in self.turns:
            out.setdefault(t.role, t.adapter_version)
        return out

    @property
    def num_tokens(self) -> int:
        return sum(len(t.completion_ids) for t in self.turns)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        d = dict(d)
        d["turns"] = [Turn(**t) for t in d["turns"]]
        return cls(**d)


def save_jsonl(trajectories: Iterable[Trajectory], path: str | Path) -> None:
    with open(path, "w") as f:
        for t in trajectories:
            f.write(json.dumps(t.to_dict()) + "\n")


def load_jsonl(path: str | Path) -> Iterator[Trajectory]:
    with open(path) as f:
        for line in f:
            if line.strip():
                yield Trajectory.from_dict(json.loads(line))


def prompt_group(prompt: str) -> str:
    """The group id of every served episode of one prompt text (training's group-normalised advantages
    compare episodes of the same prompt; a per-request id would put each episode alone in its group)."""
    return "prompt-" + hashlib.sha256(prompt.encode()).hexdigest()[:16]
