"""Which tokens of a streamed episode are the answer's (`content` deltas), decided as they are decoded.

The answer is the final turn's text without the stop string that ended it (graphs/chat_model.py). A team
whose final turn is known before it runs (round-robin, no final-answer rule: the last turn of the last
round) streams that turn's pieces as content deltas as they are decoded, holding back only what could
still turn out to be the start of a stop string. A user graph (or any other team) whose served config
names its `answer_role` (serving/server.py) streams the first turn that role speaks, live, the same way:
the config promises that the role answers once, last (e.g. the graph's final node, whose message the
default `team.output` reads). Any other team (a custom router, an `is_final` rule, a user graph without
an answer role) learns its final turn only when the episode ends: its answer goes out as one delta then.
docs/serving.md, "Token streaming", states the rule for clients.
"""

from __future__ import annotations

from teamtr.graphs.team import RoundRobin, Team


def final_turn_index(graph: object) -> int | None:
    """The index of the turn that will be the answer, when the team fixes it before running; else None."""
    if not isinstance(graph, Team) or graph.is_final is not None or not isinstance(graph.router, RoundRobin):
        return None
    turns = graph.router.rounds * len(graph.roles)
    if graph.max_turns:
        turns = min(turns, graph.max_turns)
    return turns - 1


def safe_prefix(text: str, stops: tuple[str, ...]) -> str:
    """The part of a turn's text so far that is surely in its answer: cut at the first stop string, and
    without a tail that a stop string may still complete."""
    cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=-1)
    if cut >= 0:
        return text[:cut]
    hold = max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
    return text[: len(text) - hold]


class AnswerStream:
    """Collects one episode's token pieces and says which new text is answer content to send."""

    def __init__(
        self, final_turn: int | None, stops_of: dict[str, tuple[str, ...]], answer_role: str | None = None
    ) -> None:
        """`final_turn`: the answer's turn index, when the team fixes it; else `answer_role`: the answer is
        the first turn that role speaks."""
        self.final_turn, self.stops_of, self.answer_role = final_turn, stops_of, answer_role
        self.raw = ""  # the final turn's text so far
        self.sent = ""  # the content already sent

    def piece(self, turn: int, role: str, text: str) -> str:
        """New content to send now ("" if none) after `text` was decoded in turn `turn` by `role`."""
        if self.final_turn is None and role == self.answer_role:
            self.final_turn = turn  # the answer role's first turn: the answer from here on
        if turn != self.final_turn:
            return ""
        self.raw += text
        return self._advance(safe_prefix(self.raw, self.stops_of.get(role, ())))

    def finish(self, answer: str) -> str:
        """The rest of the answer, once the episode has ended."""
        return self._advance(answer)

    def _advance(self, content: str) -> str:
        if not content.startswith(self.sent):  # cannot happen for a predicted final turn; send nothing wrong
            return ""
        new, self.sent = content[len(self.sent) :], content
        return new
