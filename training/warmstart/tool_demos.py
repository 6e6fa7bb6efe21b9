"""Tool-call demonstrations: a warm start for a team whose solver calls a calculator tool
(examples/tool_team.py), so that the tiny character-level model starts out writing `<tool_call>` blocks
some of the time and RL has a tool to learn to use.

The demonstrated solver, on a chain task such as `3+7+9`, either
- calls `calc` (`call_rate`) with the task's expression, or with one operand off by one (`slip_rate`),
  then writes the value the tool returned (so a slipped call ends on a wrong value), or
- answers directly with the sum (hard for this model: it learns it only partly).
The reviewer is demonstrated the right sum on every transcript: it confirms a right value and corrects
a wrong one (which it manages only sometimes). RL can then raise accuracy by calling more often and
copying the expression exactly.

Contexts are rendered with `render_prompt_ids` and the tools' schemas as `EngineChatModel.bind_tools`
passes them, so the ids trained on are the ids the team acts on; a message ends with the end-of-sequence
token (the example's roles have no stop string: a call spans several lines). The loop is data.py's loss
and batches and build.py's deterministic settings and learning-rate schedule; it runs a fixed number of
steps (no band search: the team is a LangGraph graph, measured by running it, examples/tool_team_eval.py).
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.messages.tool import tool_call
from transformers import PreTrainedTokenizerFast

from teamtr.graphs.chat_format import render_prompt_ids
from teamtr.graphs.task import TaskInstance
from teamtr.graphs.tool_calls import format_tool_call
from teamtr.tasks.chain import ChainArithmetic
from teamtr.training.tiny_models import build_char_tokenizer, new_model, save_model
from teamtr.training.warmstart.build import deterministic_torch, lr_at
from teamtr.training.warmstart.config import WarmStartConfig
from teamtr.training.warmstart.data import IGNORE_INDEX, StepExample, collate, completion_loss

TOOL_WARM_FILE = "tool_warmstart.json"
CONTEXT_POSITIONS = 2048  # the tools' schemas make a solver context ~600 characters (RoPE: no weights)


@dataclass(frozen=True)
class ToolTeamPrompts:
    """What the team's roles see: their system prompts, the solver's tools (OpenAI tool dicts, as
    `bind_tools` converts them) and the tool's name and argument."""

    solver: str
    reviewer: str
    tools: tuple[dict[str, Any], ...]
    tool_name: str = "calc"
    argument: str = "expression"


@dataclass(frozen=True)
class ToolDemoMix:
    call_rate: float = 0.6  # solver demonstrations that call the tool
    slip_rate: float = 0.2  # calls whose expression has one operand off by one


def _slipped(operands: list[int], rng: random.Random) -> str:
    ops = list(operands)
    k = rng.randrange(len(ops))
    ops[k] = ops[k] + 1 if ops[k] < 9 else ops[k] - 1
    return "+".join(map(str, ops))


def tool_team_examples(
    tokenizer: PreTrainedTokenizerFast,
    prompts: ToolTeamPrompts,
    instance: TaskInstance,
    rng: random.Random,
    mix: ToolDemoMix = ToolDemoMix(),
) -> list[StepExample]:
    """One demonstrated episode of the tool team on a chain instance: the solver's message(s), each on
    the transcript so far, and the reviewer's."""
    operands: list[int] = instance.meta["operands"]
    eos = [tokenizer.eos_token_id]
    tools = list(prompts.tools)
    messages: list[BaseMessage] = [HumanMessage(instance.prompt)]
    out: list[StepExample] = []

    def solver_says(text: str, reply: AIMessage) -> None:
        ids = render_prompt_ids(tokenizer, [SystemMessage(prompts.solver), *messages], None, tools)
        out.append(StepExample("solver", ids, tokenizer(text, add_special_tokens=False)["input_ids"] + eos))
        messages.append(reply)

    if rng.random() < mix.call_rate:
        expression = _slipped(operands, rng) if rng.random() < mix.slip_rate else instance.prompt
        args = {prompts.argument: expression}
        call = tool_call(name=prompts.tool_name, args=args, id="c0")
        solver_says(format_tool_call(prompts.tool_name, args), AIMessage("", tool_calls=[call]))
        value = str(sum(int(x) for x in expression.split("+")))
        messages.append(ToolMessage(value, tool_call_id="c0"))
        solver_says(value, AIMessage(value))
    else:
        solver_says(str(instance.answer), AIMessage(str(instance.answer)))
    ids = render_prompt_ids(tokenizer, [SystemMessage(prompts.reviewer), *messages])
    out.append(
        StepExample(
            "reviewer", ids, tokenizer(str(instance.answer), add_special_tokens=False)["input_ids"] + eos
        )
    )
    return out


def _role_batches(examples: list[StepExample], pad_id: int) -> list[dict[str, torch.Tensor]]:
    """One batch per role: a role's contexts share its system prompt, which `completion_loss` then runs
    once for the whole batch."""
    by_role: dict[str, list[tuple[list[int], list[int]]]] = {}
    for ex in examples:
        ids = ex.prompt_ids + ex.completion_ids
        labels = [IGNORE_INDEX] * len(ex.prompt_ids) + ex.completion_ids
        by_role.setdefault(ex.role, []).append((ids, labels))
    return [collate(seqs, pad_id) for _, seqs in sorted(by_role.items())]


def build_tool_warm_model(
    prompts: ToolTeamPrompts,
    out_dir: str | Path,
    cfg: WarmStartConfig | None = None,
    mix: ToolDemoMix = ToolDemoMix(),
) -> dict[str, Any]:
    """Train the tiny model `cfg.max_steps` steps on tool-team demonstrations (chain tasks of `cfg.steps`
    operands up to `cfg.max_operand`), save it to `out_dir` and return what was done (also written to
    `tool_warmstart.json` there)."""
    cfg = cfg or WarmStartConfig(max_steps=300)
    family = ChainArithmetic(steps=cfg.steps, max_operand=cfg.max_operand)
    start = time.perf_counter()
    losses: list[float] = []
    with deterministic_torch(cfg.threads):
        rng = random.Random(f"tool-demos-{cfg.seed}")
        tokenizer = build_char_tokenizer()
        model = new_model(tokenizer, cfg.hidden, cfg.layers, cfg.heads, cfg.seed)
        model.config.max_position_embeddings = CONTEXT_POSITIONS
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        for step in range(cfg.max_steps):
            instances = family.generate(cfg.batch_size, seed=f"tool-train-{cfg.seed}-{step}")
            examples = [
                e for inst in instances for e in tool_team_examples(tokenizer, prompts, inst, rng, mix)
            ]
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, cfg)
            batches = _role_batches(examples, tokenizer.pad_token_id)
            loss = sum(completion_loss(model, b) for b in batches) / len(batches)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            losses.append(round(loss.item(), 4))
        model.eval()
    out = Path(out_dir)
    save_model(model, tokenizer, out)
    report = {
        "config": dataclasses.asdict(cfg),
        "mix": dataclasses.asdict(mix),
        "seconds": round(time.perf_counter() - start, 1),
        "final_loss": losses[-1] if losses else None,
        "loss_every_25_steps": losses[::25],
    }
    (out / TOOL_WARM_FILE).write_text(json.dumps(report, indent=1))
    return report
