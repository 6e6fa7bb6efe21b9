"""Stage-level safety: a run never ends below its best validated stage beyond noise (docs/training.md).

After every stage the trainer measures the held-out (validation) return of the team (`eval.stage_episodes`
tasks of `task.eval_seed`, never trained on). With `eval.keep_best`, a stage whose return is below the
best earlier one by more than two standard errors of the difference (`worse_beyond_noise`: a one-sided z
test, wrongly true about 2.3% of the time for equal teams) is undone: every role gets the best stage's
weights back, as new versions, and the next stage starts from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


def worse_beyond_noise(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Whether `after`'s accuracy is below `before`'s by more than 2 standard errors of the difference of
    two binomial estimates (rewards in [0, 1]: p (1 - p) bounds their variance)."""
    pb, nb = before["accuracy"], max(before["episodes"], 1)
    pa, na = after["accuracy"], max(after["episodes"], 1)
    return pb - pa > 2 * (pb * (1 - pb) / nb + pa * (1 - pa) / na) ** 0.5


@dataclass
class BestStage:
    """The best validated team so far: its stage count (0 = the start), return and every role's weights."""

    stage: int = 0
    result: dict[str, Any] = field(default_factory=dict)  # its held-out return record
    weights: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)  # adapter -> LoRA tensors

    def offer(self, stage: int, result: dict[str, Any], weights: dict[str, dict[str, torch.Tensor]]) -> None:
        """Record stage `stage`'s team if its return beats the best so far (the start always counts)."""
        if result.get("accuracy") is None:
            return
        if not self.result or result["accuracy"] > self.result["accuracy"]:
            self.stage, self.result, self.weights = stage, dict(result), weights

    def should_revert(self, result: dict[str, Any]) -> bool:
        return bool(self.result) and result.get("accuracy") is not None and worse_beyond_noise(self.result, result)
