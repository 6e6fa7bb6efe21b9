"""The small warm-started model of each task family, built here (no model hub) and cached.

`build_warm_model` makes the character tokenizer and a tiny LlamaForCausalLM, trains it by supervised
learning on demonstrations of every role's message (loss on the message tokens only), and saves
it with `save_pretrained` as soon as held-out TEAM accuracy (greedy, the whole chain, each role acting
on the messages the model itself wrote) enters a target band: partial competence, so RL has room.
The jump from ~0% to ~90% is sudden, so it evaluates often, snapshots the weights at every evaluation,
and rolls back and evaluates more finely when one evaluation jumps over the band.

The team trained and evaluated is the team `teamtr eval` runs for that family (see `WarmTeam`):
- `chain`: the demo's adders; role k writes the running sum after addition k (`10+9+5`, `19+5`, `24`);
- `split`: generic solvers, role i sees its private table; role i writes its own lookup of the symbol
  the previous role wrote (the hand-off), the last role's lookup is the answer;
- every other family: generic solvers with the family's short system prompt (evals/runners.py); every
  role writes the family's reference answer (`family.demonstration`) on the correct transcript so far,
  so role 1 solves the task and the later roles learn to check / pass on the answer.

Training contexts are rendered with the very function rollouts use
(`render_prompt_ids(tokenizer, role_messages(role, task, transcript))`, the role's private view added
by `evals.runners.with_private_view`), so there is no drift between the ids a role is trained on and
the ids it acts on. The team is scored with the family's own verifier.

`ensure_warm_model` caches the result in the user's cache directory, keyed by a hash of the config.
The saved folder loads with the plain `AutoModelForCausalLM.from_pretrained(path)` /
`PreTrainedTokenizerFast.from_pretrained(path)`, the same code that takes any Hugging Face model path.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import fcntl
import hashlib
import inspect
import json
import logging
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

from teamtr.evals.tasks import get_task, task_names
from teamtr.evals.tasks.chain import ChainArithmetic
from teamtr.graphs.chain_team import chain_roles
from teamtr.graphs.chat_format import render_prompt_ids
from teamtr.graphs.roles import Role, role_messages
from teamtr.graphs.task import TaskFamily, TaskInstance
from teamtr.training.tiny_models import MESSAGE_END, build_char_tokenizer, tiny_llama_config

log = logging.getLogger(__name__)

# Bump when the training recipe changes in a way the config does not show: old cache entries go stale.
WARMSTART_FORMAT = 1
REPORT_FILE = "warmstart.json"  # written last: its presence (and its file hashes) marks a complete build
HISTORY_FILE = "warmstart_history.jsonl"
CURVE_FILE = "warmstart_curve.png"
IGNORE_INDEX = -100


@dataclass
class WarmStartConfig:
    """How a warm-started model is built (the defaults: the chain demo model; `warm_config_for(task)`
    gives each family's tuned settings).

    Measured with the defaults on this 2-core machine while other jobs kept it busy (load average 6-8,
    so 1 thread): seeds 0/1/2 entered the band after 320/280/320 steps, 104-121 s for the whole build,
    greedy team accuracy 33.6%/34.0%/34.0%, sampled 21.2%/24.5%/18.9%, pass@8 79.2%/80.2%/75.0%.
    """

    # model: a LlamaForCausalLM over the character tokenizer; head size = hidden / heads = 32 (vLLM)
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    # task: the chain task's knobs (steps = roles in the team; operands drawn from 1..max_operand).
    # Single digits by default: two-digit operands (max 20-40) need 3-10x more training than 3 minutes.
    # For the other families `steps` is the number of roles too; `max_operand` is chain's only.
    steps: int = 3
    max_operand: int = 9
    # the message protocol: numbers joined by this in every demonstrated message (the task prompt keeps
    # "+"). Another separator makes a model that solves the same task but speaks differently to its
    # teammates (benchmarks/swap_shock.py's newcomer).
    message_separator: str = "+"
    # the task family (a name in teamtr.evals.tasks) and its constructor knobs (chain: use steps and
    # max_operand above; task_options must stay empty)
    task: str = "chain"
    task_options: dict = field(default_factory=dict)
    # optimisation
    lr: float = 2e-3  # AdamW peak learning rate, after a linear warm-up
    warmup_steps: int = 30
    weight_decay: float = 0.01
    batch_size: int = 16  # episodes per step (each trains all its messages); 16 learnt faster than 32/64
    grad_clip: float = 1.0
    max_steps: int = 5000  # optimizer steps (the time limit below usually ends training first)
    max_seconds: float = 180.0  # hard cap on the whole build: training and evaluation
    # evaluation: greedy team accuracy on held-out tasks decides when to stop
    eval_every: int = 40  # optimizer steps between evaluations (a few seconds at the defaults)
    eval_tasks: int = 128  # held-out tasks per periodic evaluation
    final_eval_tasks: int = 256  # held-out tasks for the reported greedy figures (fresh, not used to stop)
    sampled_eval_tasks: int = 96  # the first of those also sampled, `samples_per_task` episodes each
    samples_per_task: int = 8  # sampled episodes per task for sampled accuracy and pass@k
    stop_accuracy: float = 0.30  # stop at the first evaluation with greedy team accuracy >= this
    band: tuple[float, float] = (0.20, 0.70)  # the checkpoint kept must score inside this band
    seed: int = 0
    threads: int = 2  # torch threads while building (the one place that may use more than 1) ...
    # ... unless the machine is busy: on 2 shared cores, 2 threads ran ~10x slower than 1 (spinning
    # threads), so with less than `threads` cores idle (1-minute load average) fewer are used.
    adapt_threads: bool = True
    eval_reserve_seconds: float = 30.0  # of max_seconds, kept for the final evaluation and saving

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
        if not 0 <= self.eval_reserve_seconds < self.max_seconds:
            raise ValueError("need 0 <= eval_reserve_seconds < max_seconds")
        if self.task not in task_names():
            raise ValueError(f"unknown task {self.task!r}; known: {', '.join(task_names())}")
        if self.task == "chain" and self.task_options:
            raise ValueError("chain: set steps / max_operand, not task_options")
        try:  # a misspelt knob is an error now, not minutes into a build
            get_task(self.task, **self.task_options)
        except TypeError as e:
            raise ValueError(f"{self.task}: bad task_options {self.task_options}: {e}") from None

    def cache_key(self) -> str:
        """Hash of everything that shapes the model (not the thread count)."""
        fields = dataclasses.asdict(self)
        for name in ("threads", "adapt_threads"):
            fields.pop(name)
        # fields added later are left out at their defaults, so the old cache keys stay valid
        for name, default in (("message_separator", "+"), ("task", "chain"), ("task_options", {})):
            if fields[name] == default:
                fields.pop(name)
        if self.task != "chain":  # the family's effective knobs: a changed family default is a new model,
            family = get_task(self.task, **self.task_options)  # and options equal to the defaults are not
            fields.pop("task_options", None)
            fields["task_knobs"] = dataclasses.asdict(family.defaults)
        fields["format"] = WARMSTART_FORMAT
        blob = json.dumps(fields, sort_keys=True, default=list).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


# Each family's warm-start settings (see docs/evals.md, "Headroom"): the family's own default
# difficulty, and what differs from WarmStartConfig's defaults for that family (time cap, batch, a band
# above the level of a guess). countdown and arbench reach their band; zebra, autologi, blocksworld and
# split do not learn their task within these few minutes on one thread (the best checkpoint is kept).
FAMILY_SETTINGS: dict[str, dict] = {
    "countdown": dict(max_seconds=240.0),
    # a well-formed guess is right about 1/3 of the time (one of 3 values; 1-2 of 6 arrangements):
    # stop well above that, where the model has learnt something
    "zebra": dict(max_seconds=270.0, batch_size=8, eval_every=60, stop_accuracy=0.5, band=(0.4, 0.75)),
    "autologi": dict(max_seconds=240.0, stop_accuracy=0.5, band=(0.4, 0.75)),
    # plans of up to ~70 characters, written by every role: long sequences, slow steps and evaluations
    "blocksworld": dict(
        max_seconds=300.0,
        batch_size=8,
        eval_every=80,
        eval_tasks=64,
        final_eval_tasks=128,
        sampled_eval_tasks=48,
        eval_reserve_seconds=60.0,
    ),
    "arbench": dict(max_seconds=240.0),
    # a guess is right 1/4 of the time; each role's context is its own (its private table), so
    # nothing is packed: smaller batches, more steps
    "split": dict(max_seconds=270.0, batch_size=8, stop_accuracy=0.45, band=(0.35, 0.75)),
}


def warm_config_for(task: str, **overrides) -> WarmStartConfig:
    """The warm-start config of a task family: `WarmStartConfig()` itself for `chain` (the demo model,
    cache key unchanged) and for names without a warm start (real benchmarks); else FAMILY_SETTINGS."""
    if task == "chain" or task not in FAMILY_SETTINGS:
        return WarmStartConfig(**overrides)
    return WarmStartConfig(task=task, **{**FAMILY_SETTINGS[task], **overrides})


@dataclass
class TeamEval:
    """Accuracy of the team on held-out tasks, each role acting on the messages the model wrote."""

    team_accuracy: float  # fraction of episodes whose final message is the right sum
    step_accuracy: list[float]  # per role: fraction of its messages that are exactly right ...
    step_inputs: list[int]  # ... counted over the episodes where every earlier message was right
    episodes: int

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class WarmStartReport:
    """What a build produced and measured; saved as `warmstart.json` next to the model."""

    path: str
    config: dict
    seconds: float  # wall time of the whole build
    train_seconds: float
    optimizer_steps: int
    train_tokens: int
    in_band: bool
    greedy: TeamEval  # on `final_eval_tasks` fresh held-out tasks
    sampled: TeamEval  # temperature 1, `samples_per_task` episodes on each of `sampled_eval_tasks`
    pass_at_k: float  # fraction of tasks solved by at least one of `samples_per_task` sampled episodes
    k: int
    stopped_because: str
    rollbacks: int
    threads: int  # torch threads actually used
    history: list[dict] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # file name -> sha256, checked by the cache

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> WarmStartReport:
        d = dict(d)
        d["greedy"] = TeamEval(**d["greedy"])
        d["sampled"] = TeamEval(**d["sampled"])
        return cls(**d)

    def summary(self) -> str:
        steps = ", ".join(f"{a:.0%}" for a in self.greedy.step_accuracy)
        return (
            f"warm start: {self.seconds:.0f} s ({self.optimizer_steps} steps); greedy team accuracy "
            f"{self.greedy.team_accuracy:.1%} (per role {steps}), sampled {self.sampled.team_accuracy:.1%}, "
            f"pass@{self.k} {self.pass_at_k:.1%}; {'in' if self.in_band else 'OUTSIDE'} the target band"
        )


# ----------------------------------------------------------------------------------------------------
# The team: its roles on an instance, what each role is demonstrated to write, and when a message is right


class WarmTeam:
    """The generic team of `teamtr eval` for a family: role i (0-based) acts with
    `with_private_view(role_i, family, instance, i)` and is demonstrated `family.demonstration(instance, i)`
    (the family's reference answer, or for `split` its own lookup)."""

    def __init__(self, family: TaskFamily, roles: list[Role]) -> None:
        if not hasattr(family, "demonstration"):
            raise ValueError(
                f"task {family.name!r} has no demonstration(instance, role_index): no warm start"
            )
        self.family, self.roles = family, roles

    def roles_for(self, instance: TaskInstance) -> list[Role]:
        from teamtr.evals.runners import with_private_view

        return [with_private_view(r, self.family, instance, i) for i, r in enumerate(self.roles)]

    def demonstration(self, instance: TaskInstance, index: int) -> str:
        return self.family.demonstration(instance, index)

    def message_ok(self, instance: TaskInstance, index: int, message: str) -> bool:
        """The demonstrated message, or, where that message is itself a full answer, any answer the
        verifier accepts (another valid plan, arrangement or expression)."""
        demo = self.demonstration(instance, index)
        if message == demo:
            return True
        return self.family.verify(instance, demo) == 1.0 and self.family.verify(instance, message) == 1.0

    def max_new_tokens(self, instances: list[TaskInstance]) -> int:
        """Room for the longest demonstrated message and a little more (a wrong answer may be longer)."""
        longest = max(len(self.demonstration(i, k)) for i in instances for k in range(len(self.roles)))
        return longest + 8


class ChainTeam(WarmTeam):
    """The chain demo's adders: role k writes the running sum after addition k+1 (joined by `separator`)."""

    def __init__(self, family: ChainArithmetic, roles: list[Role], separator: str = "+") -> None:
        self.family, self.roles, self.separator = family, roles, separator

    def demonstration(self, instance: TaskInstance, index: int) -> str:
        return ChainArithmetic.demonstration(instance.meta["operands"], index + 1, self.separator)

    def message_ok(self, instance: TaskInstance, index: int, message: str) -> bool:
        return message == self.demonstration(instance, index)

    def max_new_tokens(self, instances: list[TaskInstance]) -> int:
        # a message is never longer than the task written with the message protocol's separator
        return max(len(inst.prompt.replace("+", self.separator)) for inst in instances) + 1


def warm_team(cfg: WarmStartConfig) -> tuple[TaskFamily, WarmTeam]:
    """The task family and the team that `cfg` trains (the team `teamtr eval` runs for that family)."""
    if cfg.task == "chain":
        family = ChainArithmetic(steps=cfg.steps, max_operand=cfg.max_operand)
        return family, ChainTeam(family, chain_roles(cfg.steps), cfg.message_separator)
    from teamtr.evals.runners import default_roles

    family = get_task(cfg.task, **cfg.task_options)
    return family, WarmTeam(family, default_roles(cfg.task, cfg.steps))


def _as_team(task: TaskFamily | None, team: WarmTeam | list[Role], separator: str = "+") -> WarmTeam:
    """A list of roles means the chain's adders (the original signature of these functions)."""
    if isinstance(team, WarmTeam):
        return team
    chain = task if isinstance(task, ChainArithmetic) else ChainArithmetic(steps=len(team))
    return ChainTeam(chain, team, separator)


# ----------------------------------------------------------------------------------------------------
# Supervised data: one episode = every step's (context, demonstration) pair


@dataclass
class StepExample:
    """Role k's context rendered exactly as at rollout time, and the demonstration it should write."""

    role: str
    prompt_ids: list[int]
    completion_ids: list[int]  # the message followed by MESSAGE_END


def episode_examples(
    tokenizer: PreTrainedTokenizerFast,
    team: WarmTeam | list[Role],
    instance: TaskInstance,
) -> list[StepExample]:
    """The demonstration of every step of one task, each on the correct transcript so far.

    `team`: a WarmTeam, or a list of roles meaning the chain task's adders."""
    team = _as_team(None, team)
    transcript: list[tuple[str, str]] = []
    out = []
    for index, role in enumerate(team.roles_for(instance)):
        message = team.demonstration(instance, index)
        prompt_ids = render_prompt_ids(tokenizer, role_messages(role, instance.prompt, transcript))
        completion_ids = tokenizer(message + MESSAGE_END, add_special_tokens=False)["input_ids"]
        out.append(StepExample(role.name, prompt_ids, completion_ids))
        transcript.append((role.name, message))
    return out


def pack_episode(examples: list[StepExample]) -> list[tuple[list[int], list[int]]]:
    """Sequences of (input ids, labels), loss on completion tokens only.

    When each step's context is the previous context plus the previous message (true for the chat
    template here), the whole episode is one sequence and one forward pass trains every step: for a
    causal model that is the same loss as the separate examples. Otherwise each step stays separate.
    """
    sequences: list[tuple[list[int], list[int]]] = []
    ids: list[int] = []
    labels: list[int] = []
    for ex in examples:
        if ids and ex.prompt_ids[: len(ids)] != ids:  # no shared prefix: start a new sequence
            sequences.append((ids, labels))
            ids, labels = [], []
        new_prompt = ex.prompt_ids[len(ids) :]
        ids = ids + new_prompt + ex.completion_ids
        labels = labels + [IGNORE_INDEX] * len(new_prompt) + ex.completion_ids
    if ids:
        sequences.append((ids, labels))
    return sequences


def collate(sequences: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch for training (padding is masked out of attention and loss)."""
    width = max(len(ids) for ids, _ in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    labels = torch.full((len(sequences), width), IGNORE_INDEX, dtype=torch.long)
    attention = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, (ids, lab) in enumerate(sequences):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, : len(lab)] = torch.tensor(lab)
        attention[i, : len(ids)] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention}


def training_batches(
    tokenizer: PreTrainedTokenizerFast,
    task: TaskFamily,
    team: WarmTeam | list[Role],
    cfg: WarmStartConfig,
) -> Iterator[dict[str, torch.Tensor]]:
    """Fresh demonstrations every step (batch b uses task seed `train-b`): there is no epoch to overfit."""
    team = _as_team(task, team, cfg.message_separator)
    b = 0
    while True:
        instances = task.generate(cfg.batch_size, seed=f"train-{cfg.seed}-{b}")
        sequences = [s for inst in instances for s in pack_episode(episode_examples(tokenizer, team, inst))]
        yield collate(sequences, tokenizer.pad_token_id)
        b += 1


def completion_loss(
    model: PreTrainedModel, batch: dict[str, torch.Tensor], share_prefix: bool = True
) -> torch.Tensor:
    """Mean next-token cross-entropy over the completion (message) tokens of the batch.

    Every context starts with the same tokens (the system prompt: about half of each sequence), so with
    `share_prefix` that common prefix runs once, its key/value cache is repeated over the batch, and
    only the rest runs per row: the same loss and gradients for about half the compute.
    """
    input_ids, labels, attention = batch["input_ids"], batch["labels"], batch["attention_mask"]
    prefix = _unsupervised_common_prefix(input_ids, labels, attention) if share_prefix else 0
    if prefix < 1:
        logits = model(input_ids=input_ids, attention_mask=attention).logits
    else:
        cache_kw = _cache_keyword(model)
        head = model(input_ids=input_ids[:1, :prefix], use_cache=True)
        cache = getattr(head, cache_kw)
        cache.batch_repeat_interleave(input_ids.shape[0])
        logits = model(
            input_ids=input_ids[:, prefix:], attention_mask=attention, **{cache_kw: cache}
        ).logits  # positions prefix.. ; position t predicts token t + 1
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].flatten(0, 1).float(), labels[:, prefix + 1 :].flatten(), ignore_index=IGNORE_INDEX
    )


def _unsupervised_common_prefix(
    input_ids: torch.Tensor, labels: torch.Tensor, attention: torch.Tensor
) -> int:
    """Length P of the prefix shared by every row, such that no label at positions <= P is supervised
    (so the logits of the prefix are not needed)."""
    shared = ((input_ids == input_ids[:1]) & (attention == 1)).all(0).long().cumprod(0).sum()
    supervised = (labels != IGNORE_INDEX).any(0)
    first_label = int(supervised.long().argmax()) if supervised.any() else input_ids.shape[1]
    return max(0, min(int(shared), first_label - 1))


def _cache_keyword(model: PreTrainedModel) -> str:
    """transformers renamed `past_key_values` to `cache` during 5.x; take whichever this version has."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


# ----------------------------------------------------------------------------------------------------
# Team evaluation: batched decoding of the whole chain, each role conditioned on the model's own messages


@torch.no_grad()
def generate_messages(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    prompts: list[list[int]],
    temperature: float,
    max_new_tokens: int,
) -> list[str]:
    """One message per prompt (greedy when temperature is 0), cut at the first MESSAGE_END."""
    newline_id = tokenizer.convert_tokens_to_ids(MESSAGE_END)
    width = max(map(len, prompts))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])  # left padding
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention,
        max_new_tokens=max_new_tokens,
        eos_token_id=newline_id,
        pad_token_id=pad,
        **(sampling if temperature > 0 else {"do_sample": False}),
    )
    texts = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    return [t.split(MESSAGE_END, 1)[0] for t in texts]


def team_rollouts(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    team: WarmTeam | list[Role],
    instances: list[TaskInstance],
    temperature: float = 0.0,
) -> list[list[tuple[str, str]]]:
    """The whole team on every instance, one batched generate per role; returns each transcript.

    `team`: a WarmTeam, or a list of roles meaning the chain task's adders."""
    team = _as_team(None, team)
    was_training = model.training
    model.eval()
    transcripts: list[list[tuple[str, str]]] = [[] for _ in instances]
    max_new = team.max_new_tokens(instances)
    roles_of = [team.roles_for(inst) for inst in instances]  # split: each role with its private table
    for index in range(len(team.roles)):
        prompts = [
            render_prompt_ids(tokenizer, role_messages(roles[index], inst.prompt, tr))
            for inst, roles, tr in zip(instances, roles_of, transcripts, strict=True)
        ]
        messages = generate_messages(model, tokenizer, prompts, temperature, max_new)
        for roles, tr, msg in zip(roles_of, transcripts, messages, strict=True):
            tr.append((roles[index].name, msg))
    model.train(was_training)
    return transcripts


def evaluate_team(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    task: TaskFamily,
    team: WarmTeam | list[Role],
    instances: list[TaskInstance],
    temperature: float = 0.0,
) -> tuple[TeamEval, list[float]]:
    """Team accuracy (the family's verifier on the final message) and per-role accuracy (given correct
    input); also each episode's reward. `team`: a WarmTeam, or a list of roles meaning chain's adders."""
    team = _as_team(task, team)
    roles = team.roles
    transcripts = team_rollouts(model, tokenizer, team, instances, temperature)
    step_right, step_inputs = [0] * len(roles), [0] * len(roles)
    for inst, tr in zip(instances, transcripts, strict=True):
        for k, (_, msg) in enumerate(tr):  # count role k only while every earlier message was right
            step_inputs[k] += 1
            if not team.message_ok(inst, k, msg):
                break
            step_right[k] += 1
    rewards = [task.verify(inst, tr[-1][1]) for inst, tr in zip(instances, transcripts, strict=True)]
    team = TeamEval(
        team_accuracy=sum(rewards) / len(rewards),
        step_accuracy=[r / n if n else 0.0 for r, n in zip(step_right, step_inputs, strict=True)],
        step_inputs=step_inputs,
        episodes=len(instances),
    )
    return team, rewards


def sampled_eval(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    task: TaskFamily,
    team: WarmTeam | list[Role],
    instances: list[TaskInstance],
    k: int,
) -> tuple[TeamEval, float]:
    """Temperature-1 team accuracy over k episodes per task, and pass@k (any of the k episodes right)."""
    repeated = [inst for inst in instances for _ in range(k)]
    team, rewards = evaluate_team(model, tokenizer, task, team, repeated, temperature=1.0)
    solved = [max(rewards[i * k : (i + 1) * k]) for i in range(len(instances))]
    return team, sum(solved) / len(solved)


# ----------------------------------------------------------------------------------------------------
# Build


def new_model(tokenizer: PreTrainedTokenizerFast, hidden: int, layers: int, heads: int, seed: int):
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config(len(tokenizer), hidden=hidden, layers=layers, heads=heads))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def save_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def tiny_random_model(out_dir: str | Path, seed: int = 0) -> Path:
    """A seconds-sized untrained model (hidden 64, 2 layers, 2 heads of 32) for tests of other areas."""
    out = Path(out_dir)
    tokenizer = build_char_tokenizer()
    save_model(new_model(tokenizer, hidden=64, layers=2, heads=2, seed=seed), tokenizer, out)
    return out


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _lr_at(step: int, cfg: WarmStartConfig) -> float:
    """Linear warm-up, then constant: the stop comes from the accuracy band, not from a schedule's end."""
    return cfg.lr * min(1.0, (step + 1) / cfg.warmup_steps)


def build_warm_model(cfg: WarmStartConfig, out_dir: str | Path, progress: bool = True) -> WarmStartReport:
    """Train the demo model until held-out greedy team accuracy enters the band, then save it to `out_dir`."""
    threads = threads_to_use(cfg.threads) if cfg.adapt_threads else cfg.threads
    with torch_threads(threads):
        return _build(cfg, Path(out_dir), progress)


def threads_to_use(wanted: int) -> int:
    """`wanted`, or fewer when fewer cores are idle: oversubscribed torch threads spin and crawl."""
    try:
        idle = (os.cpu_count() or 1) - os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return wanted
    return max(1, min(wanted, math.floor(idle + 0.5)))


def _build(cfg: WarmStartConfig, out_dir: Path, progress: bool) -> WarmStartReport:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    start = time.perf_counter()
    random.seed(cfg.seed)
    tokenizer = build_char_tokenizer()
    task, roles = warm_team(cfg)  # `roles`: the WarmTeam (the chain's adders by default)
    model = new_model(tokenizer, cfg.hidden, cfg.layers, cfg.heads, cfg.seed)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    eval_set = task.generate(cfg.eval_tasks, seed=f"warmstart-eval-{cfg.seed}")
    lo, hi = cfg.band

    # Data is indexed by step, so a rollback replays exactly the same batches.
    batches: dict[int, dict[str, torch.Tensor]] = {}  # kept from the last snapshot on
    stream = training_batches(tokenizer, task, roles, cfg)
    produced = 0

    def batch_at(step: int) -> dict[str, torch.Tensor]:
        nonlocal produced
        while produced <= step:
            batches[produced] = next(stream)
            produced += 1
        return batches[step]

    step, train_tokens, rollbacks = 0, 0, 0
    eval_every = cfg.eval_every
    snapshot = (0, 0, copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict()))
    best: tuple[float, int, dict] | None = None  # (accuracy, step, weights) of the best evaluation <= band
    history: list[dict] = []
    stopped_because = "max_steps"
    train_seconds = 0.0
    bar = Progress(
        TextColumn("[bold]warm start[/]"), BarColumn(), TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(), disable=not progress, transient=False,
    )  # fmt: skip
    with bar:
        bar_task = bar.add_task("train", total=cfg.max_seconds, status="")
        while step < cfg.max_steps:
            if time.perf_counter() - start > cfg.max_seconds - cfg.eval_reserve_seconds:
                stopped_because = "max_seconds"
                break
            t0 = time.perf_counter()
            batch = batch_at(step)
            for group in optimizer.param_groups:
                group["lr"] = _lr_at(step, cfg)
            loss = completion_loss(model, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            step += 1
            train_tokens += int(batch["attention_mask"].sum())
            train_seconds += time.perf_counter() - t0
            if step % eval_every:
                continue

            team, _ = evaluate_team(model, tokenizer, task, roles, eval_set)
            elapsed = time.perf_counter() - start
            row = {"step": step, "seconds": round(elapsed, 2), "loss": round(loss.item(), 4),
                   "team_accuracy": team.team_accuracy, "step_accuracy": team.step_accuracy,
                   "eval_every": eval_every}  # fmt: skip
            history.append(row)
            log.info("warm start %s", row)
            per_role = " ".join(f"{a:.0%}" for a in team.step_accuracy)
            bar.update(bar_task, completed=min(elapsed, cfg.max_seconds),
                       status=f"step {step} loss {loss.item():.3f} team {team.team_accuracy:.0%} "
                              f"roles {per_role}")  # fmt: skip
            if team.team_accuracy > hi and eval_every > 1:
                # Jumped over the band between two evaluations: replay from the last one, looking closer.
                step, train_tokens, model_state, opt_state = snapshot
                model.load_state_dict(model_state)
                optimizer.load_state_dict(opt_state)
                eval_every = max(1, eval_every // 4)
                rollbacks += 1
                continue
            if team.team_accuracy >= cfg.stop_accuracy:
                stopped_because = "reached stop_accuracy"
                break
            snapshot = (step, train_tokens, copy.deepcopy(model.state_dict()),
                        copy.deepcopy(optimizer.state_dict()))  # fmt: skip
            if best is None or team.team_accuracy > best[0]:
                best = (team.team_accuracy, step, snapshot[2])
            for old in [b for b in batches if b < step]:
                del batches[old]

        if stopped_because != "reached stop_accuracy" and best is not None:
            # Out of time: the weights between two evaluations are unmeasured (and accuracy swings
            # from one evaluation to the next), so keep the best evaluated checkpoint instead.
            model.load_state_dict(best[2])
            stopped_because += f"; kept the best evaluated checkpoint (step {best[1]}, {best[0]:.0%})"
        model.eval()
        final_set = task.generate(cfg.final_eval_tasks, seed=f"warmstart-final-{cfg.seed}")
        greedy, _ = evaluate_team(model, tokenizer, task, roles, final_set)
        torch.manual_seed(cfg.seed)
        sampled, pass_at_k = sampled_eval(
            model,
            tokenizer,
            task,
            roles,
            final_set[: cfg.sampled_eval_tasks],
            cfg.samples_per_task,
        )

    save_model(model, tokenizer, out_dir)
    report = WarmStartReport(
        path=str(out_dir),
        config=dataclasses.asdict(cfg),
        seconds=time.perf_counter() - start,  # everything but writing this report and its plot
        train_seconds=train_seconds,
        optimizer_steps=step,
        train_tokens=train_tokens,
        in_band=lo <= greedy.team_accuracy <= hi,
        greedy=greedy,
        sampled=sampled,
        pass_at_k=pass_at_k,
        k=cfg.samples_per_task,
        stopped_because=stopped_because,
        rollbacks=rollbacks,
        threads=torch.get_num_threads(),
        history=history,
    )
    _write_report_files(report, out_dir)
    if not report.in_band:
        log.warning("warm start ended outside the band %s: %s", cfg.band, report.summary())
    return report


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_report_files(report: WarmStartReport, out_dir: Path) -> None:
    with open(out_dir / HISTORY_FILE, "w") as f:
        for row in report.history:
            f.write(json.dumps(row) + "\n")
    _plot_history(report, out_dir / CURVE_FILE)
    report.files = {p.name: _sha256(p) for p in sorted(out_dir.iterdir()) if p.is_file()}
    tmp = out_dir / (REPORT_FILE + ".tmp")
    tmp.write_text(json.dumps(report.as_dict(), indent=1))
    tmp.replace(out_dir / REPORT_FILE)  # last, and atomic: marks the folder complete


def _plot_history(report: WarmStartReport, png: Path) -> None:
    if not report.history:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seconds = [r["seconds"] for r in report.history]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(seconds, [r["team_accuracy"] for r in report.history], "k-o", ms=3, label="team (greedy)")
    for k in range(len(report.history[0]["step_accuracy"])):
        ax.plot(
            seconds,
            [r["step_accuracy"][k] for r in report.history],
            "--",
            label=f"role {k + 1} (on correct input)",
        )
    ax.axhspan(*report.config["band"], color="green", alpha=0.1, label="target band")
    ax.set_xlabel("seconds since build start")
    ax.set_ylabel("held-out accuracy")
    ax.set_ylim(0, 1)
    ax.set_title(f"warm start (supervised, {report.config.get('task', 'chain')} task)")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------------
# Cache


def cache_root() -> Path:
    """`$TEAMTR_CACHE`, else the platform's user cache directory for teamtr."""
    env = os.environ.get("TEAMTR_CACHE")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("teamtr"))


def is_complete(path: Path) -> bool:
    """A cached build is complete when its report exists and every file matches the hash it recorded."""
    try:
        files = json.loads((path / REPORT_FILE).read_text())["files"]
        return bool(files) and all(_sha256(path / name) == digest for name, digest in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def load_report(path: str | Path) -> WarmStartReport:
    return WarmStartReport.from_dict(json.loads((Path(path) / REPORT_FILE).read_text()))


def ensure_warm_model(cfg: WarmStartConfig | None = None, progress: bool = True) -> Path:
    """The cached warm-started model for `cfg` (built on first use, rebuilt when missing or damaged).

    Safe when several processes ask at once: a lock file makes the later ones wait for the first build,
    and a build is written to a temporary folder that is renamed into place only when complete.
    """
    cfg = cfg or WarmStartConfig()
    root = cache_root() / "models"
    final = root / f"{cfg.task}-warm-{cfg.cache_key()}"
    if is_complete(final):
        return final
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if is_complete(final):  # another process built it while we waited
            return final
        if final.exists():  # partial or corrupt: move aside atomically, then delete
            trash = Path(tempfile.mkdtemp(prefix=f".{final.name}.trash-", dir=root))
            final.rename(trash / "old")
            shutil.rmtree(trash, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.build-", dir=root))
        try:
            build_warm_model(cfg, tmp, progress=progress)
            report = load_report(tmp)
            report.path = str(final)
            _rewrite_report(report, tmp)
            tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _rewrite_report(report: WarmStartReport, out_dir: Path) -> None:
    tmp = out_dir / (REPORT_FILE + ".tmp")
    tmp.write_text(json.dumps(report.as_dict(), indent=1))
    tmp.replace(out_dir / REPORT_FILE)


def main(argv: list[str] | None = None) -> None:
    """`python -m teamtr.training.warmstart [SEED] [--task T] [--out DIR | --cache]`: build (into DIR,
    default runs/warmstart-[T-]seedSEED, or into the model cache) with a progress bar; print the report."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m teamtr.training.warmstart", description=main.__doc__)
    parser.add_argument("seed", nargs="?", type=int, default=0)
    parser.add_argument("--task", default="chain", choices=task_names())
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--cache", action="store_true", help="build into the model cache (reused later)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the config's)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    threads = {} if args.threads is None else {"threads": args.threads, "adapt_threads": False}
    cfg = warm_config_for(args.task, seed=args.seed, **threads)
    if args.cache:
        report = load_report(ensure_warm_model(cfg))
    else:
        name = f"warmstart-seed{cfg.seed}" if cfg.task == "chain" else f"warmstart-{cfg.task}-seed{cfg.seed}"
        report = build_warm_model(cfg, args.out or Path("runs") / name)
    print(report.summary())
    print(json.dumps({k: v for k, v in report.as_dict().items() if k not in ("history", "files")}, indent=1))


if __name__ == "__main__":
    main()
