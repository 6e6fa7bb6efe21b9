"""Team accuracy of the model being built: batched decoding of the whole team on held-out tasks, each
role conditioned on the messages the model itself wrote, scored by the family's own verifier.

It decodes the in-memory model under training with `model.generate` (one batched call per role). The
embedded engine (engines/embedded.py) decodes the same way but loads its models from a path and runs
every episode through the LangGraph team; the build evaluates every few dozen steps, so it stays here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from teamtr.graphs.chat_format import render_prompt_ids
from teamtr.graphs.roles import Role, role_messages
from teamtr.graphs.task import TaskFamily, TaskInstance
from teamtr.training.tiny_models import MESSAGE_END
from teamtr.training.warmstart.teams import WarmTeam, as_team


@dataclass
class TeamEval:
    """Accuracy of the team on held-out tasks, each role acting on the messages the model wrote."""

    team_accuracy: float  # fraction of episodes whose final message the verifier accepts
    step_accuracy: list[float]  # per role: fraction of its messages that are right ...
    step_inputs: list[int]  # ... counted over the episodes where every earlier message was right
    episodes: int

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


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
    team = as_team(None, team)
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
    team = as_team(task, team)
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
    result = TeamEval(
        team_accuracy=sum(rewards) / len(rewards),
        step_accuracy=[r / n if n else 0.0 for r, n in zip(step_right, step_inputs, strict=True)],
        step_inputs=step_inputs,
        episodes=len(instances),
    )
    return result, rewards


def sampled_eval(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    task: TaskFamily,
    team: WarmTeam | list[Role],
    instances: list[TaskInstance],
    k: int,
) -> tuple[TeamEval, float]:
    """Temperature-1 team accuracy over k episodes per task, and pass@k (any of the k episodes right).
    Samples from torch's global generator: seed it first for a reproducible figure."""
    repeated = [inst for inst in instances for _ in range(k)]
    result, rewards = evaluate_team(model, tokenizer, task, team, repeated, temperature=1.0)
    solved = [max(rewards[i * k : (i + 1) * k]) for i in range(len(instances))]
    return result, sum(solved) / len(solved)
