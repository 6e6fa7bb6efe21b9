"""Who judges a candidate: by default a signal it was not trained on, so a mis-specified or poisoned
training reward cannot vouch for the team it produced.

    gate    the held-out prompts' answers are scored by `gate_judge`: auto = the run's verifier, when
            training used a reward function (module:function) and the verifier can score a bare served
            prompt; or an explicit verifier / verifier:TASK / module:function
    canary  live episodes are scored by `canary_judge`: auto = the stored `/v1/feedback` rewards when the
            window's episodes have any, else the gate's judge; or explicit feedback / verifier / ...

A judge may be an LLM (`judge:FILE`, llm_judge.py). Training on feedback (`--reward feedback`, or
`--train-on-feedback` beside a reward) makes feedback a training reward: it can judge no gate, and the
canary only when allowed.

When the only judge left is the training reward itself, improve refuses, saying so, unless
`allow_training_reward` is set (then every record says the judge was the training reward).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from teamtr.improve.data import ImproveDataError, RewardFn

AUTO, FEEDBACK, TRAINING = "auto", "feedback", "reward"


@dataclass
class Judges:
    gate: RewardFn
    gate_name: str
    canary: RewardFn | None  # None: the episode's stored feedback
    canary_name: str
    notes: list[str]


def _same(a: str, b: str, task: str) -> bool:
    """Two reward specs name the same signal ("verifier" is "verifier:<the run's task>")."""
    norm = {"verifier": f"verifier:{task}"}
    return norm.get(a, a) == norm.get(b, b)


def resolve_judges(
    training: str,
    gate: str,
    canary: str,
    *,
    task: str,
    load: Callable[[str], RewardFn],
    training_reward: RewardFn,
    has_feedback: bool,
    allow_training_reward: bool,
    trained_on_feedback: bool = False,
) -> Judges:
    """`load(spec)` builds a reward from a spec (verifier | verifier:TASK | module:function |
    judge:FILE). `trained_on_feedback`: served feedback is (part of) the training reward, so it is no
    independent judge of the canary either."""
    notes: list[str] = []

    def independent(spec: str, where: str) -> tuple[RewardFn, str]:
        if spec == TRAINING or _same(spec, training, task):
            if not allow_training_reward:
                raise ImproveDataError(
                    f"the {where} would be judged by the training reward ({training}), the signal the "
                    f"candidate was trained to raise, so a mis-specified reward would vouch for itself: give "
                    f"--{where}-judge (a held-out verifier, verifier:TASK or module:function"
                    f"{', or feedback' if where == 'canary' else ''}), or --allow-training-reward-judge"
                )
            notes.append(f"the {where} is judged by the training reward ({training}), as allowed")
            return training_reward, f"{training} (the training reward)"
        return load(spec), spec

    if gate == AUTO:
        if _same("verifier", training, task):
            gate = TRAINING  # the verifier is the training reward: nothing independent is left
        else:
            try:
                load("verifier")
                gate = "verifier"
            except ImproveDataError:
                gate = TRAINING
    if gate == FEEDBACK:
        raise ImproveDataError(
            "feedback scores only served episodes, not the gate's fresh answers to held-out prompts: "
            "give --gate-judge verifier, verifier:TASK or module:function"
        )
    if gate == TRAINING and training == FEEDBACK:
        raise ImproveDataError(
            "training on feedback alone leaves nothing to judge the gate's fresh answers to held-out prompts: "
            "give --gate-judge judge:FILE (an LLM judge), verifier:TASK or module:function"
        )
    gate_fn, gate_name = independent(gate, "gate")
    if canary == AUTO:
        canary = FEEDBACK if has_feedback else gate
        if canary == FEEDBACK:
            notes.append("the canary is judged by the served episodes' /v1/feedback rewards")
    if canary == FEEDBACK:
        if trained_on_feedback:
            if not allow_training_reward:
                raise ImproveDataError(
                    "the canary would be judged by /v1/feedback, which the candidate was trained on, so it "
                    "could learn what earns feedback rather than what is right: give --canary-judge "
                    "(judge:FILE, verifier:TASK or module:function), or --allow-training-reward-judge"
                )
            notes.append("the canary is judged by feedback, which training used too, as allowed")
            return Judges(gate_fn, gate_name, None, f"{FEEDBACK} (a training reward)", notes)
        return Judges(gate_fn, gate_name, None, FEEDBACK, notes)
    if canary == gate:
        return Judges(gate_fn, gate_name, gate_fn, gate_name, notes)
    canary_fn, canary_name = independent(canary, "canary")
    return Judges(gate_fn, gate_name, canary_fn, canary_name, notes)
