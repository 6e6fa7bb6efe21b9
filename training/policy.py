"""pi_j of an LLM team: one role's LoRA adapter on a trainable engine (graphs/engine.py `TrainableEngine`,
e.g. the embedded one), with the AdamW that updates it.

What the per-agent step (training/teamtr_step.py) needs of a policy: log-probabilities of sampled tokens
(with or without a gradient), an exact snapshot to undo an attempt, and a commit that swaps the accepted
weights in (version bump: the next rollouts record the new version). Under torchrun, `data_parallel`
splits each log-prob computation over the ranks and sums their gradients (training/distributed.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

from teamtr.engines.embedded_scoring import enable_body_checkpointing
from teamtr.graphs.engine import TrainableEngine
from teamtr.training.distributed import DataParallel
from teamtr.training.rollouts import RoleMessages, padded_logprobs
from teamtr.training.token_counts import pass_tokens
from teamtr.training.trust_region import AdapterState

SCORE_CHUNK = 64  # at most this many messages per forward pass when computing log-probs
# ... and at most this many padded tokens (messages x the longest prompt + completion among them); a longer
# message goes alone. 16,384 keeps 64 messages per pass where messages are short (the tiny models'), 16 at
# 1,024 tokens (training/config.py OptimConfig.logprob_token_budget)
TOKEN_BUDGET = 16_384


def message_lengths(prompts: list[list[int]], completions: list[list[int]]) -> list[int]:
    """Prompt + completion tokens of each message: what `budget_chunks` sizes passes by."""
    return [len(p) + len(c) for p, c in zip(prompts, completions, strict=True)]


def budget_chunks(lengths: list[int], budget: int, max_messages: int = SCORE_CHUNK) -> list[tuple[int, int]]:
    """[start, end) message ranges, in order, one per forward pass: each at most `max_messages` messages
    and `budget` padded tokens (count x longest of `lengths`, prompt + completion tokens), or one message.
    Fixed by the lengths alone, so the same messages always meet in the same passes."""
    chunks: list[tuple[int, int]] = []
    start, longest = 0, 0
    for i, n in enumerate(lengths):
        wider = max(longest, n)
        if i > start and ((i + 1 - start) * wider > budget or i - start >= max_messages):
            chunks.append((start, i))
            start, wider = i, n
        longest = wider
    if lengths:
        chunks.append((start, len(lengths)))
    return chunks


@dataclass
class AdapterPolicy:
    engine: TrainableEngine
    adapter: str
    base: str
    params: dict[str, torch.nn.Parameter]
    # one optimizer per adapter: a shared AdamW would move inactive adapters through their momentum
    optimizer: torch.optim.Optimizer
    # the policy trained is pi_T = softmax(logits / T), the distribution rollouts sample from
    # (training/behaviour.py refuses turns sampled otherwise; docs/training.md "Sampling temperature")
    temperature: float = 1.0
    data_parallel: DataParallel | None = None  # torchrun: this rank's share of every log-prob pass
    # tokens of every log-prob pass so far (all ranks' shares): training/token_counts.py count 3
    passed_tokens: int = 0
    # padded prompt + completion tokens per forward pass (OptimConfig.logprob_token_budget)
    token_budget: int = TOKEN_BUDGET
    # checkpoint the model body's layers in passes with a gradient (OptimConfig.gradient_checkpointing);
    # switched on for the whole base model, never off again in this process
    gradient_checkpointing: bool = False
    # log-prob passes under bfloat16 autocast when the model is on a CUDA device (OptimConfig.bf16_autocast)
    bf16_autocast: bool = True

    def __post_init__(self) -> None:
        if self.gradient_checkpointing:
            enable_body_checkpointing(self.engine.model(self.base))

    def logp(self, msgs: RoleMessages, grad: bool) -> torch.Tensor:
        """[M, T] log pi_T(x_u | s, x_<u) of msgs' completion tokens (padding 0). Data parallel: this
        rank computes its share of the messages, the other ranks' shares are gathered (no gradient)."""
        self.passed_tokens += pass_tokens(msgs.prompts, msgs.completions)
        dp = self.data_parallel
        if dp is None:
            return self._logp(msgs, grad)
        start, end = dp.shard(len(msgs))
        local = self._logp(msgs.subset(torch.arange(start, end)), grad)
        return dp.gather_rows(local, len(msgs))

    def _logp(self, msgs: RoleMessages, grad: bool) -> torch.Tensor:
        if len(msgs) == 0:
            return torch.zeros_like(msgs.mask)

        with torch.set_grad_enabled(grad):  # one call: `_passes` splits the messages by the token budget
            return padded_logprobs(self._passes, msgs, len(msgs))

    def _passes(self, prompts: list[list[int]], completions: list[list[int]]) -> list[torch.Tensor]:
        """Per-message log pi_T, one forward pass per `budget_chunks` range."""
        return [row for _, _, rows in self._pass_rows(prompts, completions) for row in rows]

    def _pass_rows(
        self, prompts: list[list[int]], completions: list[list[int]]
    ) -> Iterator[tuple[int, int, list[torch.Tensor]]]:
        """(start, end, per-message log pi_T) of each `budget_chunks` pass, in order (autocast per pass)."""
        for s, e in budget_chunks(message_lengths(prompts, completions), self.token_budget):
            with self._autocast():
                rows = self.engine.token_logprobs(
                    prompts[s:e], completions[s:e], self.adapter, self.base, self.temperature
                )
            yield s, e, rows

    def backward(self, msgs: RoleMessages, upstream: torch.Tensor) -> None:
        """Backpropagate `upstream` = d loss / d log pi of msgs' completion tokens ([M, T], as `logp`
        returns them) into the adapter's .grad, one `budget_chunks` pass at a time: each pass's graph is
        freed by its own backward, so the activations held are one pass's, never the minibatch's. Data
        parallel: this rank's share of the messages (its rows of `upstream`); `sync_gradients` sums."""
        self.passed_tokens += pass_tokens(msgs.prompts, msgs.completions)
        start, end = (0, len(msgs)) if self.data_parallel is None else self.data_parallel.shard(len(msgs))
        with torch.enable_grad():
            for s, e, rows in self._pass_rows(msgs.prompts[start:end], msgs.completions[start:end]):
                values = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
                grad = upstream[start + s : start + e, : values.shape[1]].to(values.device)  # the model's device
                torch.autograd.backward(values, grad)

    def loss_backward(
        self, msgs: RoleMessages, loss_of: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """loss_of(log pi of msgs [M, T]) backpropagated into the adapter's .grad; returns the loss.

        Messages that fit in one forward pass: one pass with a gradient, one backward. More than one pass:
        gradient caching, so memory follows `token_budget` and not the minibatch: the log-probs first
        without a gradient, d loss / d log-probs on them (the loss is cheap), then `backward` pass by pass.
        Exact by the chain rule (no dropout in the adapters); the price is one more forward pass."""
        if len(budget_chunks(message_lengths(msgs.prompts, msgs.completions), self.token_budget)) <= 1:
            loss = loss_of(self.logp(msgs, grad=True))
            loss.backward()
            return loss.detach()
        logp = self.logp(msgs, grad=False).requires_grad_()
        loss = loss_of(logp)
        loss.backward()
        self.backward(msgs, logp.grad)
        return loss.detach()

    def _autocast(self) -> AbstractContextManager:
        device = next(self.engine.model(self.base).parameters()).device
        if self.bf16_autocast and device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return nullcontext()

    def sync_gradients(self) -> None:
        """After backward: data parallel, the gradients summed over the ranks; one process, nothing."""
        if self.data_parallel is not None:
            self.data_parallel.all_reduce_gradients(list(self.params.values()))

    def agree(self, value: float) -> float:
        """A number the trust region decides on, rank 0's on every rank (data parallel)."""
        return value if self.data_parallel is None else self.data_parallel.agree(value)

    def score(self, prompts: list[list[int]], completions: list[list[int]]) -> list[torch.Tensor]:
        """Per-message log pi_T of completions at the current weights, without a gradient."""
        self.passed_tokens += pass_tokens(prompts, completions)
        with torch.no_grad():
            return self._passes(prompts, completions)

    def snapshot(self) -> Callable[[], None]:
        """Save the LoRA tensors and the AdamW state; the returned function restores them bit for bit."""
        return AdapterState(self.params, self.optimizer).save().restore

    def version(self) -> int:
        return self.engine.adapter_version(self.adapter, self.base)

    def commit(self) -> int:
        """Swap the current weights in as the role's next version; returns that version."""
        return self.engine.commit_adapter_update(self.adapter, self.base)

    def weights(self) -> dict[str, torch.Tensor]:
        return self.engine.snapshot_adapter(self.adapter, self.base)

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.engine.restore_adapter(self.adapter, weights, self.base)
