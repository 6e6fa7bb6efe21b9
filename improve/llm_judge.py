"""An LLM judge as a reward: a prompt file scored by a model, for teams with neither a verifier nor a
reward function (`--reward judge:FILE`, `--gate-judge judge:FILE`, `--canary-judge judge:FILE`).

The file is a template with `{prompt}` (the served task) and `{response}` (the team's final answer),
ending where the judge's one-word answer begins, e.g.

    Task: {prompt}
    Answer: {response}
    Is the answer correct? Reply yes or no.
    Reply:

The reward is the judge's probability of "yes" against "no" at that point,
p(yes) / (p(yes) + p(no)) in [0, 1], read from the log-probs of the two words (`Engine.score`), not from
a sampled reply: a parsed reply is noisy and often unparsable for a small judge, the two log-probs give
a graded score for any model. The words after a template that ends in a space or a newline are "yes"
and "no", else " yes" and " no" (the tokens a reply would start with). The judge is the base model
of `--judge-model` (default: the served run's base model) on the embedded engine, or the vLLM server
at `--judge-url` (graphs/engine.py `Engine.score` on either, engines/open.py `open_engine`).
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from teamtr.engines.open import EngineSpec, OpenedEngine, VLLMSpec, open_engine
from teamtr.graphs.engine import DEFAULT_BASE
from teamtr.improve.data import ImproveDataError, RewardFn

FIELDS = ("prompt", "response")


def read_template(path: str | Path) -> str:
    """The judge's template; ImproveDataError unless it names {response} and only the known fields."""
    p = Path(path)
    if not p.is_file():
        raise ImproveDataError(f"judge prompt file {p} does not exist")
    text = p.read_text()
    try:
        named = {f for _, f, _, _ in string.Formatter().parse(text) if f is not None}
    except ValueError as e:
        raise ImproveDataError(f"judge prompt {p}: not a template ({e}); write literal braces as {{{{ }}}}") from None
    unknown = named - set(FIELDS)
    if unknown or "response" not in named:
        raise ImproveDataError(
            f"judge prompt {p}: fields {sorted(named)}; it must use {{response}} (and may use {{prompt}}), "
            f"nothing else{f' (unknown: {sorted(unknown)})' if unknown else ''}"
        )
    return text


@dataclass
class LLMJudge:
    """p(yes) / (p(yes) + p(no)) of the judge model after the filled template."""

    template: str
    engine: Any  # graphs/engine.py Engine: its tokenizer and score
    base: str = DEFAULT_BASE

    def __post_init__(self) -> None:
        tok = self.engine.tokenizer(self.base)
        spaced = not self.template[-1:].isspace()
        self._words = [
            tok((" " if spaced else "") + w, add_special_tokens=False)["input_ids"] for w in ("yes", "no")
        ]

    def __call__(self, prompt: str, response: str) -> float:
        text = self.template.format(prompt=prompt, response=response)
        ids = self.engine.tokenizer(self.base)(text, add_special_tokens=False)["input_ids"]
        yes, no = (sum(s) for s in self.engine.score([ids, ids], self._words, None, self.base))
        return 1.0 / (1.0 + math.exp(no - yes))  # p(yes) / (p(yes) + p(no))


def open_judge(
    template_file: str | Path, model: str, url: str | None = None
) -> tuple[RewardFn, OpenedEngine]:
    """The judge reward on `model` (embedded) or on the vLLM server at `url` serving it; close the
    returned engine when done."""
    template = read_template(template_file)
    spec = EngineSpec(
        bases={DEFAULT_BASE: model},
        kind="vllm" if url else "embedded",
        threads=1,
        vllm=VLLMSpec(url=url, setting="--judge-url"),
    )
    opened = open_engine(spec)
    return LLMJudge(template, opened.engine), opened
