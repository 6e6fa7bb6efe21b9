"""What `teamtr swap` is asked to do (`SwapConfig`) and the progress hooks it reports to (`SwapProgress`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Divergence = Literal["auto", "token", "text"]
Target = Literal["incumbent", "mixture"]


@dataclass
class SwapConfig:
    """What `teamtr swap` does. Defaults follow docs/swap.md (500 probes, delta_0 = 0.01)."""

    role: str  # the role whose model is replaced
    model: str  # the newcomer: a model directory (weights + its own tokenizer)
    out: str | None = None  # new run directory; None = "<RUN_DIR>-swap-<role>"
    probes: int = 500  # contexts at the role's turns, from the current team's episodes
    delta0: float = 0.01  # stop when the monitored KL(newcomer || incumbent) per message is <= this
    align: bool = True  # False = a direct swap (no Stage-0): the newcomer enters as it is
    target: Target = "incumbent"  # or the geometric mixture of newcomer-before-alignment and incumbent
    mixture_lambda: float = 4.0  # lambda of the mixture target (weight lambda/(1+lambda) on the incumbent)
    divergence: Divergence = "auto"  # "token" needs identical tokenizers; "auto" picks
    lr: float = 3e-3  # AdamW on the newcomer's LoRA adapter (1e-2 bounced on the chain models) ...
    final_lr_ratio: float = 0.1  # ... decayed linearly over the rounds to lr * this (1.0 = constant)
    # Protocol unification: round 0 trains the newcomer by cross-entropy on the incumbent's own messages
    # at the probes (mass-covering: it adopts the team's message format) for this many passes, before
    # the reverse-KL rounds (mode-seeking: they match the incumbent's distribution). 0 = off.
    unify_epochs: int = 0
    max_rounds: int = 30  # rounds of (sample at every probe, monitor, `epochs` passes of minibatches)
    epochs: int = 4  # passes over a round's samples (the newcomer moves little within a round)
    minibatch: int = 64  # probe messages per optimizer step
    extra_stages: int = 3  # TeamTR stages the new run has left to train (config `stages` grows by this)
    base_name: str | None = None  # the newcomer's base-model name; None = "<role>-swap<k>"
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.probes, self.minibatch, self.max_rounds, self.epochs) < 1 or self.extra_stages < 0:
            raise ValueError("probes, minibatch, max_rounds and epochs must be >= 1, extra_stages >= 0")
        if self.unify_epochs < 0:
            raise ValueError("unify_epochs must be >= 0")
        if self.delta0 <= 0:
            raise ValueError("delta0 must be > 0")
        if self.mixture_lambda <= 0:
            raise ValueError("mixture_lambda must be > 0")
        if not 0 < self.final_lr_ratio <= 1:
            raise ValueError("final_lr_ratio must be in (0, 1]")


class SwapProgress:
    """Progress hooks of a swap (the CLI draws a rich progress bar). No-ops by default."""

    def probes(self, done: int, total: int) -> None: ...
    def round(self, k: int, rounds: int, kl: float, delta0: float) -> None: ...
    def message(self, text: str) -> None: ...
