"""Stage-0 of a swap: the newcomer's LoRA adapter minimises KL(newcomer || target) on the probe contexts.

    KL(newcomer || target) = E_{m ~ newcomer} sum_u KL(q(.|s, x_<u) || t(.|s, x_<u))

target = the incumbent, or the geometric mixture t ∝ pi_pre^(1/(1+lambda)) * pi_inc^(lambda/(1+lambda))
(pi_pre = the newcomer before alignment); rounds of (sample at every probe, monitor, train) until the
MONITORED KL(newcomer || incumbent) on fresh newcomer messages is <= delta_0. With `unify_epochs`, round 0
is protocol unification instead: cross-entropy on the incumbent's own messages (docs/swap.md).

Divergence, two modes (chosen automatically; `divergence=` forces one):
- "token" (same tokenizer): exact per-token KL over the whole vocabulary at each position of the
  newcomer's sampled messages, summed over the message's tokens, mean over messages. Exact in the
  vocabulary sum, so lower variance than the sampled k1 of eq. 11; gradients flow through the
  per-token KL only (the dependence of the sampled prefixes on the newcomer is ignored, as in
  on-policy distillation).
- "text" (different tokenizers: other vocabulary, other id order, extra tokens): the KL is taken over
  message TEXT. Each model renders the same context messages with its own tokenizer and chat template;
  a message sampled from the newcomer is decoded to text and re-tokenised by the incumbent (its EOS
  appended when the newcomer ended with EOS); r = log q(m) - log p(m) with each model's log-prob of its
  own tokenisation of the same text. Monitored: the k3 form mean(exp(-r) - 1 + r) (unbiased for
  KL(q || p) under samples of q and >= 0 per message); gradient: the score function
  E_q[(r - baseline) grad log q(m)] with the batch-mean baseline.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from teamtr.graphs.chat_format import render_prompt_ids
from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.team import derive_seed
from teamtr.training.swap.config import SwapConfig, SwapProgress
from teamtr.training.swap.probes import Probe
from teamtr.training.vocab_kl import Side, completion_mask, full_logprobs, token_kl_per_message


def same_tokenizer(a: Any, b: Any) -> bool:
    """Token mode needs the same ids for the same strings and the same chat template."""
    return (
        a.get_vocab() == b.get_vocab()
        and a.chat_template == b.chat_template
        and a.eos_token_id == b.eos_token_id
    )


def sequence_logprob(side: Side, prompts: list[list[int]], completions: list[list[int]]) -> torch.Tensor:
    """[M] log pi(m | s) = sum_u log pi(x_u | s, x_<u) (0 for an empty completion)."""
    out = torch.zeros(len(prompts))
    keep = [i for i, c in enumerate(completions) if c]
    if keep:
        lps = side.engine.token_logprobs(
            [prompts[i] for i in keep], [completions[i] for i in keep], side.adapter, side.base
        )
        out = out.index_put((torch.tensor(keep),), torch.stack([lp.sum() for lp in lps]))
    return out


@dataclass
class Samples:
    """The newcomer's messages at the probe contexts (one per probe), in both tokenisations."""

    new_prompts: list[list[int]]
    new_completions: list[list[int]]
    inc_prompts: list[list[int]]
    inc_completions: list[list[int]]  # text mode: the incumbent's tokenisation of the same text

    def __len__(self) -> int:
        return len(self.new_prompts)

    def subset(self, idx: list[int]) -> Samples:
        return Samples(*([getattr(self, f.name)[i] for i in idx] for f in dataclasses.fields(self)))


class Aligner:
    """Stage-0: the newcomer's LoRA adapter minimises KL(newcomer || target) on the probe contexts."""

    def __init__(
        self,
        newcomer: Side,
        incumbent: Side,
        probes: list[Probe],
        sampling: SamplingParams,
        cfg: SwapConfig,
    ) -> None:
        if newcomer.adapter is None:
            raise ValueError("the newcomer needs a LoRA adapter to train")
        self.new, self.inc, self.cfg, self.sampling = newcomer, incumbent, cfg, sampling
        self.pre = Side(newcomer.engine, newcomer.base, None)  # pi_pre: the newcomer before alignment
        mode = cfg.divergence
        same = same_tokenizer(newcomer.tokenizer, incumbent.tokenizer)
        if mode == "auto":
            mode = "token" if same else "text"
        if mode == "token" and not same:
            raise ValueError("divergence='token' needs the same tokenizer for newcomer and incumbent")
        self.mode = mode
        self.new_prompts = [render_prompt_ids(newcomer.tokenizer, p.messages) for p in probes]
        self.inc_prompts = [render_prompt_ids(incumbent.tokenizer, p.messages) for p in probes]
        self.incumbent_messages = [self._in_newcomer_tokens(p.incumbent_ids) for p in probes]
        params = newcomer.engine.adapter_parameters(newcomer.adapter, newcomer.base)
        self.params = list(params.values())
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=0.0)
        self.sampled_tokens = 0
        self.unify_nll: tuple[float, float] | None = None  # set by unify(): NLL of m_inc before, after

    def _in_newcomer_tokens(self, incumbent_ids: list[int]) -> list[int]:
        """The incumbent's message as the newcomer's tokens (its EOS for the incumbent's EOS)."""
        if self.mode == "token":
            return list(incumbent_ids)
        inc_eos = self.inc.tokenizer.eos_token_id
        ends = bool(incumbent_ids) and incumbent_ids[-1] == inc_eos
        text = self.inc.tokenizer.decode(incumbent_ids[:-1] if ends else incumbent_ids)
        ids = self.new.tokenizer(text, add_special_tokens=False)["input_ids"]
        return [*ids, self.new.tokenizer.eos_token_id] if ends else ids

    def incumbent_nll(self, idx: list[int], grad: bool = False) -> torch.Tensor:
        """Mean over probes `idx` of -log q(m_inc | s): the newcomer's NLL of the incumbent's messages."""
        with torch.set_grad_enabled(grad):
            completions = [self.incumbent_messages[i] for i in idx]
            logq = full_logprobs(self.new, [self.new_prompts[i] for i in idx], completions)
            return -sum(logq[j, range(len(c)), c].sum() for j, c in enumerate(completions)) / len(idx)

    def unify(self, gen: torch.Generator) -> None:
        """Protocol unification: minimise -log q(m_inc | s) on the incumbent's own message at each probe
        (forward KL(incumbent || newcomer) up to a constant), `unify_epochs` passes of minibatches.
        Records the NLL over all probes before and after in `unify_nll`."""
        keep = torch.tensor([i for i, m in enumerate(self.incumbent_messages) if m], dtype=torch.long)
        if len(keep) == 0:  # the incumbent said nothing at any probe: nothing to unify on
            return
        chunks = [c.tolist() for c in keep.split(128)]

        def nll_all() -> float:
            return sum(float(self.incumbent_nll(c)) * len(c) for c in chunks) / len(keep)

        before = nll_all()
        for _ in range(self.cfg.unify_epochs):
            for idx in keep[torch.randperm(len(keep), generator=gen)].split(self.cfg.minibatch):
                nll = self.incumbent_nll(idx.tolist(), grad=True)
                self.optimizer.zero_grad(set_to_none=True)
                nll.backward()
                torch.nn.utils.clip_grad_norm_(self.params, 1.0)
                self.optimizer.step()
        self.unify_nll = (before, nll_all())

    # ---- sampling from the newcomer -----------------------------------------------------------------
    def sample(self, round_no: int) -> Samples:
        engine, new = self.new.engine, self.new

        async def all_messages() -> list:
            return await asyncio.gather(
                *(
                    engine.generate(
                        p,
                        adapter=new.adapter,
                        base=new.base,
                        sampling=dataclasses.replace(
                            self.sampling, seed=derive_seed(self.cfg.seed, "stage0", round_no, i)
                        ),
                    )
                    for i, p in enumerate(self.new_prompts)
                )
            )

        gens = asyncio.run(all_messages())
        completions = [g.completion_ids for g in gens]
        self.sampled_tokens += sum(map(len, completions))
        if self.mode == "token":
            return Samples(self.new_prompts, completions, self.inc_prompts, completions)
        inc_tok, new_eos = self.inc.tokenizer, new.tokenizer.eos_token_id
        inc_completions = []
        for g in gens:  # the same text in the incumbent's tokenisation (EOS when the newcomer ended there)
            ids = inc_tok(g.text, add_special_tokens=False)["input_ids"]
            if g.completion_ids and g.completion_ids[-1] == new_eos:
                ids = [*ids, inc_tok.eos_token_id]
            inc_completions.append(ids)
        return Samples(self.new_prompts, completions, self.inc_prompts, inc_completions)

    # ---- the divergence -----------------------------------------------------------------------------
    def _target_logp(self, s: Samples) -> torch.Tensor:
        """token mode: [M, T, V] log t; text mode: [M] log t(m) (unnormalised for the mixture)."""
        a = 1.0 / (1.0 + self.cfg.mixture_lambda)  # weight of pi_pre in the geometric mixture
        with torch.no_grad():
            if self.mode == "token":
                inc = full_logprobs(self.inc, s.inc_prompts, s.inc_completions)
                if self.cfg.target == "incumbent":
                    return inc
                pre = full_logprobs(self.pre, s.new_prompts, s.new_completions)
                return torch.log_softmax(a * pre + (1 - a) * inc, dim=-1)
            inc = sequence_logprob(self.inc, s.inc_prompts, s.inc_completions)
            if self.cfg.target == "incumbent":
                return inc
            pre = sequence_logprob(self.pre, s.new_prompts, s.new_completions)
            return a * pre + (1 - a) * inc

    def divergence(
        self, s: Samples, target: str = "incumbent", grad: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss to minimise, monitored KL per message) on these samples."""
        with torch.set_grad_enabled(grad):
            if self.mode == "token":
                q = full_logprobs(self.new, s.new_prompts, s.new_completions)
                mask = completion_mask(s.new_completions, q.shape[1])
                if target == "incumbent":
                    with torch.no_grad():
                        t = full_logprobs(self.inc, s.inc_prompts, s.inc_completions)
                else:
                    t = self._target_logp(s)
                kl_msg = token_kl_per_message(q, t, mask)
                return kl_msg.mean(), kl_msg.detach()
            log_q = sequence_logprob(self.new, s.new_prompts, s.new_completions)
            log_t = sequence_logprob(self.inc, s.inc_prompts, s.inc_completions).detach()
            if target != "incumbent":
                log_t = self._target_logp(s)
            r = (log_q - log_t).detach()
            k3 = torch.expm1(-r) + r  # >= 0, unbiased for KL(q || t) under samples of q
            loss = ((r - r.mean()) * log_q).mean()  # score function with the batch-mean baseline
            return loss, k3

    # ---- the loop -----------------------------------------------------------------------------------
    def run(self, progress: SwapProgress | None = None) -> tuple[list[float], bool, int]:
        """Rounds: sample at every probe -> monitor -> stop if <= delta_0 -> `epochs` passes of minibatches
        (round 0: protocol unification instead, when `unify_epochs` > 0).

        If the round cap comes first, the adapter of the round with the lowest monitored KL is kept (the
        KL is not monotone in the rounds) and its KL is appended to the history as the final value."""
        progress = progress or SwapProgress()
        cfg = self.cfg
        history: list[float] = []
        best: tuple[float, dict[str, torch.Tensor]] | None = None
        gen = torch.Generator().manual_seed(derive_seed(cfg.seed, "stage0-minibatches"))
        for k in range(cfg.max_rounds + 1):
            samples = self.sample(k)
            with torch.no_grad():
                kl = float(self.monitor(samples))
            history.append(kl)
            progress.round(k, cfg.max_rounds, kl, cfg.delta0)
            if kl <= cfg.delta0:
                return history, True, k
            if best is None or kl < best[0]:
                best = (kl, self.new.engine.snapshot_adapter(self.new.adapter, self.new.base))
            if k == cfg.max_rounds:
                if best[0] < kl:  # back to the closest newcomer seen
                    self.new.engine.restore_adapter(self.new.adapter, best[1], self.new.base)
                    history.append(best[0])
                return history, False, k
            for group in self.optimizer.param_groups:  # Adam's noise floor shrinks with the step size
                group["lr"] = cfg.lr * (1 - (1 - cfg.final_lr_ratio) * k / max(1, cfg.max_rounds - 1))
            if k == 0 and cfg.unify_epochs:
                self.unify(gen)  # round 0 adopts the team's protocol; the reverse KL takes it from there
                continue
            for _ in range(cfg.epochs):
                for idx in torch.randperm(len(samples), generator=gen).split(cfg.minibatch):
                    loss, _ = self.divergence(samples.subset(idx.tolist()), cfg.target, grad=True)
                    self.optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(self.params, 1.0)
                    self.optimizer.step()
        raise AssertionError("unreachable")

    def monitor(self, samples: Samples) -> float:
        """Monitored KL(newcomer || incumbent) per message on fresh newcomer samples."""
        values = [
            self.divergence(samples.subset(list(range(s, min(s + 128, len(samples))))), "incumbent")[1]
            for s in range(0, len(samples), 128)
        ]
        return float(torch.cat(values).mean())
