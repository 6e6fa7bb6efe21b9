"""pi_j of an LLM team: one role's LoRA adapter on the embedded engine, with the AdamW that updates it.

What the per-agent step (training/teamtr_step.py) needs of a policy: log-probabilities of sampled tokens
(with or without a gradient), an exact snapshot to undo an attempt, and a commit that swaps the accepted
weights in (version bump: the next rollouts record the new version). Under torchrun, `data_parallel`
splits each log-prob computation over the ranks and sums their gradients (training/distributed.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from teamtr.serving.engines.embedded import EmbeddedEngine
from teamtr.training.distributed import DataParallel
from teamtr.training.rollouts import RoleMessages, padded_logprobs
from teamtr.training.token_counts import pass_tokens
from teamtr.training.trust_region import AdapterState

SCORE_CHUNK = 64  # messages per forward pass when computing log-probs


@dataclass
class AdapterPolicy:
    engine: EmbeddedEngine
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

        def fn(p: list[list[int]], c: list[list[int]]) -> list[torch.Tensor]:
            return self.engine.token_logprobs(p, c, self.adapter, self.base, self.temperature)

        with torch.set_grad_enabled(grad):
            return padded_logprobs(fn, msgs, SCORE_CHUNK)

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
        out: list[torch.Tensor] = []
        with torch.no_grad():
            for s in range(0, len(prompts), SCORE_CHUNK):
                out += self.engine.token_logprobs(
                    prompts[s : s + SCORE_CHUNK],
                    completions[s : s + SCORE_CHUNK],
                    self.adapter,
                    self.base,
                    self.temperature,
                )
        return out

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
