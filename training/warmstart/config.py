"""How a warm-started model is built: `WarmStartConfig`, each family's settings (declared in its module,
tasks/<family>.py), and the cache key."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field

from teamtr.tasks import family_class, get_task, task_names
from teamtr.tasks.family_settings import WarmStart

# Bump when the build procedure changes its result in a way the config does not show, so that models
# cached by the old procedure are not reused as if the new one had built them.
# 2: fixed thread count and deterministic kernels inside the build; stopping on step counts only.
WARMSTART_FORMAT = 2


@dataclass
class WarmStartConfig:
    """How a warm-started model is built (the defaults: the chain model of `team.model: null`; the demo's
    is built with stop_accuracy 0.45, training/demo.py DEMO_CONFIG `team.warm_start`; `warm_config_for(task)`
    gives each family's tuned settings).

    Everything that decides the result is in here and nothing else is: the build pins its torch thread
    count to `threads`, uses deterministic kernels, and stops only on step counts and held-out accuracy,
    never on wall time, so one config gives the same weights on one machine. Not across machines: another
    CPU code path rounds differently, and the build grows that into other weights, which is why the demo's
    model is shipped (shipped.py; docs/evals.md, "Across machines: the shipped demo model").
    Measured builds: docs/evals.md, "Headroom".
    """

    # model: a LlamaForCausalLM over the character tokenizer; head size = hidden / heads = 32 (vLLM)
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    # task: the chain task's knobs (steps = roles in the team; operands drawn from 1..max_operand).
    # Single digits by default: two-digit operands need several times more training than a few minutes.
    # For the other families `steps` is the number of roles too; `max_operand` is chain's only.
    steps: int = 3
    max_operand: int = 9
    # the message protocol: numbers joined by this in every demonstrated message (the task prompt keeps
    # "+"). Another separator makes a model that solves the same task but speaks differently to its
    # teammates (benchmarks/swap_shock.py's newcomer).
    message_separator: str = "+"
    # the task family (a name in teamtr.tasks) and its constructor knobs (chain: use steps and
    # max_operand above; task_options must stay empty)
    task: str = "chain"
    task_options: dict = field(default_factory=dict)
    # optimisation
    lr: float = 2e-3  # AdamW peak learning rate, after a linear warm-up
    warmup_steps: int = 30
    weight_decay: float = 0.01
    batch_size: int = 16  # episodes per step (each trains all its messages)
    grad_clip: float = 1.0
    # the build's budget, in optimizer steps (never seconds: a time limit would make the result depend
    # on the machine's speed and load). The chain model usually stops on accuracy long before it.
    max_steps: int = 600
    # evaluation: greedy team accuracy on held-out tasks decides when to stop
    eval_every: int = 40  # optimizer steps between evaluations (a few seconds at the defaults)
    eval_tasks: int = 128  # held-out tasks per periodic evaluation
    final_eval_tasks: int = 256  # held-out tasks for the reported greedy figures (fresh, not used to stop)
    sampled_eval_tasks: int = 96  # the first of those also sampled, `samples_per_task` episodes each
    samples_per_task: int = 8  # sampled episodes per task for sampled accuracy and pass@k
    stop_accuracy: float = 0.30  # stop at the first evaluation with greedy team accuracy >= this
    band: tuple[float, float] = (0.20, 0.70)  # the checkpoint kept must score inside this band
    seed: int = 0
    # torch intra-op threads inside the build. Part of the result: reductions split over another number
    # of threads add in another order, so a different count is a different (cached) model.
    threads: int = 1
    # Accepted only as False, as shipped and cached builds record it (warmstart.json): choosing threads
    # from the machine's load made the model depend on the machine, which is why it went.
    adapt_threads: bool = False

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by heads {self.heads}")
        lo, hi = self.band
        if not 0.0 <= lo <= self.stop_accuracy <= hi <= 1.0:
            raise ValueError(
                f"need 0 <= band[0] <= stop_accuracy <= band[1] <= 1, got {self.band}, {self.stop_accuracy}"
            )
        for name in (
            "batch_size",
            "max_steps",
            "eval_every",
            "eval_tasks",
            "final_eval_tasks",
            "sampled_eval_tasks",
            "samples_per_task",
            "threads",
            "steps",
            "max_operand",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.adapt_threads:
            raise ValueError("adapt_threads is gone: the thread count is part of the result; set threads")
        if self.task not in task_names():
            raise ValueError(f"unknown task {self.task!r}; known: {', '.join(task_names())}")
        if self.task == "chain" and self.task_options:
            raise ValueError("chain: set steps / max_operand, not task_options")
        try:  # a misspelt knob is an error now, not minutes into a build
            get_task(self.task, **self.task_options)
        except TypeError as e:
            raise ValueError(f"{self.task}: bad task_options {self.task_options}: {e}") from None

    def cache_key(self) -> str:
        """Hash of everything that shapes the model: the fields, the family's effective knobs (a changed
        family default is a new model; options equal to the defaults are not) and WARMSTART_FORMAT."""
        fields = dataclasses.asdict(self)
        fields.pop("adapt_threads")
        fields.pop("task_options")
        if self.task != "chain":
            fields["task_knobs"] = dataclasses.asdict(get_task(self.task, **self.task_options).defaults)
        fields["format"] = WARMSTART_FORMAT
        blob = json.dumps(fields, sort_keys=True, default=list).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def declared_warm_start(task: str) -> WarmStart | None:
    """The warm-start settings `task`'s family declares in its module (tasks/<family>.py `warm_start`);
    None for names without a warm start of their own (real benchmarks)."""
    return getattr(family_class(task), "warm_start", None)


# Each family's warm-start settings as its module declares them (tasks/<family>.py `warm_start`): what
# differs from WarmStartConfig's defaults for that family (step budget, batch, a band above the level of a
# guess). The step budgets are about what each family's earlier few-minute builds reached on one thread
# (docs/evals.md, "Headroom"). chain's model is the defaults themselves, so it has no entry.
FAMILY_SETTINGS: dict[str, dict] = {
    name: dict(declared.changes)
    for name in task_names()
    if name != WarmStartConfig.task and (declared := declared_warm_start(name)) is not None
}


def max_steps_for(task: str, steps: int, base: int) -> int:
    """The step budget of a `steps`-role team of `task` whose budget at the measured sizes is `base`: for a
    family that declares a `scaled_budget` (measured roles, steps per role), k roles beyond the measured
    ones get 1 + 2 + ... + k times its steps more (team accuracy is the product of every role's accuracy on
    messages that lengthen with the team, so a bigger team can need many more steps; the build stops at the
    band, so a budget larger than needed costs nothing)."""
    declared = declared_warm_start(task)
    scaled = declared.scaled_budget if declared is not None else None
    measured, per_role = scaled if scaled is not None else (steps, 0)
    extra = max(0, steps - measured)
    return base + per_role * extra * (extra + 1) // 2


def warm_config_for(task: str, **overrides) -> WarmStartConfig:
    """The warm-start config of a task family: WarmStartConfig's defaults changed as the family declares
    (tasks/<family>.py `warm_start`); `WarmStartConfig()` itself for names without a warm start (real
    benchmarks). For the families that declare a `scaled_budget` the step budget grows with `steps` unless
    `max_steps` is given."""
    declared = declared_warm_start(task)
    settings = {} if declared is None else {"task": task, **declared.changes}
    if "max_steps" not in overrides and declared is not None and declared.scaled_budget is not None:
        steps = overrides.get("steps", WarmStartConfig.steps)
        base = settings.get("max_steps", WarmStartConfig.max_steps)
        settings["max_steps"] = max_steps_for(task, steps, base)
    return WarmStartConfig(**{**settings, **overrides})
