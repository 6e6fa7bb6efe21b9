"""Supervised data for the warm start: every role's (context, demonstration) pair, packed into batches,
and the loss on the demonstrated message tokens only.

Training contexts are rendered with the very function rollouts use
(`render_prompt_ids(tokenizer, role_messages(role, task, transcript))`, the role's private view added
by `tasks.roles.with_private_view`), so there is no drift between the ids a role is trained on and
the ids it acts on.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from teamtr.graphs.chat_format import render_prompt_ids
from teamtr.graphs.roles import Role, role_messages
from teamtr.graphs.task import TaskFamily, TaskInstance
from teamtr.training.tiny_models import MESSAGE_END
from teamtr.training.warmstart.config import WarmStartConfig
from teamtr.training.warmstart.teams import WarmTeam, as_team

IGNORE_INDEX = -100  # label of a token that is context, not demonstration (no loss)


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
    team = as_team(None, team)
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
    """Fresh demonstrations every step (batch b uses task seed `train-SEED-b`): there is no epoch to
    overfit, and batch b is the same whenever it is asked for (a rollback replays the same data)."""
    team = as_team(task, team, cfg.message_separator)
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
