"""Plug-and-play role replacement: Stage-0 alignment of a newcomer model (docs/swap.md).

    teamtr swap RUN_DIR --role R --model PATH [--out NEW_RUN_DIR] [--probes 500] [--delta0 0.01]

1. PROBES   contexts at role R's turns, from episodes of the current team (the run's latest checkpoint)
2. STAGE-0  the newcomer (a full model; we train a fresh LoRA adapter on it, the same kind of adapter
            the trainer trains afterwards) minimises the token-decomposed reverse KL
                KL(newcomer || target) = E_{m ~ newcomer} sum_u KL(q(.|s, x_<u) || t(.|s, x_<u))
            on the probe contexts, target = the incumbent, or the geometric mixture
                t ∝ pi_pre^(1/(1+lambda)) * pi_inc^(lambda/(1+lambda))
            (pi_pre = the newcomer before alignment), until the MONITORED KL(newcomer || incumbent)
            on fresh newcomer messages at every probe context is <= delta_0
3. WRITE    a run directory from which `teamtr train` continues: role R now names the newcomer's base
            model (config team.bases / team.role_bases), its adapter restarts at a new version, every
            other role keeps its adapter, optimizer state and beta; certificates, evals and metrics carry
            over, and the swapped team's held-out return is the "before" of the next stage.

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
import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from langchain_core.messages import BaseMessage

from teamtr.graphs.chat_format import render_prompt_ids
from teamtr.graphs.engine import DEFAULT_BASE, SamplingParams
from teamtr.graphs.roles import Role, role_messages, with_temperature
from teamtr.graphs.task import TaskFamily
from teamtr.graphs.team import Team, derive_seed
from teamtr.graphs.trajectory import Trajectory
from teamtr.serving.embedded import EmbeddedEngine
from teamtr.training.certificate import certificate_constant
from teamtr.training.checkpoint import (
    CHECKPOINTS,
    Checkpoint,
    adapter_dir,
    load_latest_checkpoint,
    save_checkpoint,
    save_peft_adapter,
)
from teamtr.training.config import TrainConfig
from teamtr.training.metrics import METRICS_FILE, MetricsLog
from teamtr.training.run_dir import RunDir
from teamtr.training.trainer import held_out_return
from teamtr.training.vocab_kl import Side, completion_mask, full_logprobs, token_kl_per_message

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


@dataclass
class Probe:
    """One context at the swapped role's turn: the messages it acts on (each model renders them)."""

    messages: list[BaseMessage]
    incumbent_text: str  # what the incumbent said there (kept for inspection)
    incumbent_ids: list[int] = field(default_factory=list)  # ... as the incumbent's tokens (to unify on)


@dataclass
class SwapResult:
    out_dir: Path
    role: str
    base_name: str
    divergence: str
    probes: int
    kl_history: list[float]  # monitored KL(newcomer || incumbent) before each round
    converged: bool  # monitored KL <= delta0
    new_version: int
    eval_before: float  # held-out team return of the incumbent team (the run's stage eval tasks)
    eval_after: float  # ... of the team with the newcomer in role R (after Stage-0 if align)
    rounds: int = 0
    sampled_tokens: int = 0  # newcomer tokens sampled during Stage-0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def kl_final(self) -> float:
        return self.kl_history[-1]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["out_dir"] = str(self.out_dir)
        d["kl_final"] = self.kl_final
        return d


class Callbacks:
    """Progress hooks (the CLI draws a rich progress bar). No-ops by default."""

    def probes(self, done: int, total: int) -> None: ...
    def round(self, k: int, rounds: int, kl: float, delta0: float) -> None: ...
    def message(self, text: str) -> None: ...


# ------------------------------------------------------------------------------------------------------
# Loading the run


def load_run(run_dir: Path) -> tuple[RunDir, Checkpoint]:
    run = RunDir(run_dir)
    ckpt = load_latest_checkpoint(run_dir)
    if ckpt is None:
        raise ValueError(f"{run_dir} has no checkpoint yet: train at least one stage before a swap")
    if ckpt.state["updates_done"] or ckpt.state["batches"]:
        raise ValueError(
            f"{run_dir} stopped in the middle of stage {ckpt.state['next_stage']}: resume it with "
            "`teamtr train` to the end of a stage, then swap"
        )
    return run, ckpt


def team_engine(run: RunDir, ckpt: Checkpoint, extra_bases: dict[str, str] | None = None) -> EmbeddedEngine:
    """The team exactly as the checkpoint left it (every role's adapter weights and version), plus
    `extra_bases` (the newcomer) loaded beside it."""
    engine = run.engine("fresh", extra_bases=extra_bases)
    for r in run.roles:
        engine.restore_adapter(
            r.adapter, {k: v.clone() for k, v in ckpt.adapters[r.adapter].items()}, r.base_model
        )
        while engine.adapter_version(r.adapter, r.base_model) < ckpt.state["versions"][r.adapter]:
            engine.commit_adapter_update(r.adapter, r.base_model)
    return engine


def same_tokenizer(a: Any, b: Any) -> bool:
    """Token mode needs the same ids for the same strings and the same chat template."""
    return (
        a.get_vocab() == b.get_vocab()
        and a.chat_template == b.chat_template
        and a.eos_token_id == b.eos_token_id
    )


# ------------------------------------------------------------------------------------------------------
# 1. PROBES


def build_probes(
    team: Team, role: Role, task: TaskFamily, n: int, seed: int, callbacks: Callbacks | None = None
) -> list[Probe]:
    """>= n contexts at `role`'s turns from episodes of the current team (rollout temperature)."""
    callbacks = callbacks or Callbacks()
    probes: list[Probe] = []
    batch = 0
    while len(probes) < n:
        tasks = task.generate(n, seed=derive_seed(seed, "swap-probes", batch))
        prompts = {t.id: t.prompt for t in tasks}
        trajectories = team.run(
            tasks, group_size=1, verifier=task, seed=derive_seed(seed, "swap-rollout", batch)
        )
        probes += probes_from(trajectories, role, prompts)
        batch += 1
        callbacks.probes(min(len(probes), n), n)
        if batch > 20 and not probes:
            raise ValueError(f"role {role.name!r} never spoke in {batch} batches of episodes")
    return probes[:n]


def probes_from(trajectories: Sequence[Trajectory], role: Role, prompts: dict[str, str]) -> list[Probe]:
    out = []
    for traj in trajectories:
        for k, turn in enumerate(traj.turns):
            if turn.role == role.name:
                transcript = [(t.role, t.text) for t in traj.turns[:k]]
                messages = role_messages(role, prompts[traj.task_id], transcript)
                out.append(Probe(messages, turn.text, list(turn.completion_ids)))
    return out


# ------------------------------------------------------------------------------------------------------
# 2. STAGE-0: the divergence and its minimisation


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
    def run(self, callbacks: Callbacks | None = None) -> tuple[list[float], bool, int]:
        """Rounds: sample at every probe -> monitor -> stop if <= delta_0 -> `epochs` passes of minibatches
        (round 0: protocol unification instead, when `unify_epochs` > 0).

        If the round cap comes first, the adapter of the round with the lowest monitored KL is kept (the
        KL is not monotone in the rounds) and its KL is appended to the history as the final value."""
        callbacks = callbacks or Callbacks()
        cfg = self.cfg
        history: list[float] = []
        best: tuple[float, dict[str, torch.Tensor]] | None = None
        gen = torch.Generator().manual_seed(derive_seed(cfg.seed, "stage0-minibatches"))
        for k in range(cfg.max_rounds + 1):
            samples = self.sample(k)
            with torch.no_grad():
                kl = float(self.monitor(samples))
            history.append(kl)
            callbacks.round(k, cfg.max_rounds, kl, cfg.delta0)
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


# ------------------------------------------------------------------------------------------------------
# 3. The whole swap


def swap_role(run_dir: str | Path, cfg: SwapConfig, callbacks: Callbacks | None = None) -> SwapResult:
    callbacks = callbacks or Callbacks()
    run_dir = Path(run_dir)
    run, ckpt = load_run(run_dir)
    train_cfg = run.config
    torch.set_num_threads(train_cfg.torch_threads)
    newcomer_path = Path(cfg.model).resolve()
    if not (newcomer_path / "config.json").is_file():
        raise FileNotFoundError(f"{cfg.model} is not a model directory (no config.json)")
    out = Path(cfg.out) if cfg.out else run_dir.with_name(f"{run_dir.name}-swap-{cfg.role}")
    if out.resolve() == run_dir.resolve():
        raise ValueError("--out must differ from RUN_DIR (the original run stays as it was)")
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty")

    roles = run.roles
    names = [r.name for r in roles]
    if cfg.role not in names:
        raise ValueError(f"unknown role {cfg.role!r}; the team's roles are {names}")
    role = next(r for r in roles if r.name == cfg.role)
    task = run.task()

    base_name = cfg.base_name or _fresh_base_name(cfg.role, train_cfg)
    if base_name in (DEFAULT_BASE, *train_cfg.team.bases):
        raise ValueError(f"base model name {base_name!r} is taken")
    engine = team_engine(run, ckpt, {base_name: str(newcomer_path)})
    torch.manual_seed(derive_seed(cfg.seed, "newcomer-lora"))
    engine.add_adapter(role.adapter, base=base_name)  # fresh LoRA (B = 0): starts as the newcomer itself
    new_roles = [dataclasses.replace(r, base_model=base_name) if r.name == cfg.role else r for r in roles]

    # held-out return of the incumbent team (the run's stage-eval tasks and seed)
    eval_tasks = task.generate(max(train_cfg.eval.stage_episodes, 1), seed=train_cfg.task.eval_seed)
    eval_seed = derive_seed(train_cfg.seed, "eval")

    def team_return(rs: list[Role]) -> dict[str, Any]:
        return held_out_return(
            Team.from_engine(with_temperature(rs, train_cfg.eval.temperature), engine),
            task,
            eval_tasks,
            eval_seed,
        )

    before = team_return(roles)
    callbacks.message(f"incumbent team: held-out return {before['accuracy']:.3f}")

    # 1. PROBES from the current team's episodes, 2. STAGE-0
    rollout_roles = with_temperature(roles, train_cfg.rollout.temperature)
    probes = build_probes(
        Team.from_engine(rollout_roles, engine, name="probes"),
        role,
        task,
        cfg.probes,
        train_cfg.seed,
        callbacks,
    )
    sampling = dataclasses.replace(role.sampling, temperature=train_cfg.rollout.temperature)
    aligner = Aligner(
        Side(engine, base_name, role.adapter),
        Side(engine, role.base_model, role.adapter),
        probes,
        sampling,
        cfg,
    )
    if cfg.align:
        history, converged, rounds = aligner.run(callbacks)
    else:  # direct swap: measure, do not move
        history = [aligner.monitor(aligner.sample(0))]
        converged, rounds = history[0] <= cfg.delta0, 0
        callbacks.round(0, 0, history[0], cfg.delta0)
    after = team_return(new_roles)
    callbacks.message(f"team with the newcomer: held-out return {after['accuracy']:.3f}")

    # 3. WRITE the new run directory
    new_version = int(ckpt.state["versions"][role.adapter]) + 1
    used_bases = {r.base_model for r in new_roles}
    new_dict = train_cfg.to_dict()  # (not with_overrides: its merge would keep bases no role uses)
    new_dict["run_dir"] = str(out)
    new_dict["stages"] = int(ckpt.state["next_stage"]) + cfg.extra_stages
    new_dict["team"]["bases"] = {
        **{b: path for b, path in train_cfg.team.bases.items() if b in used_bases},
        base_name: str(newcomer_path),
    }
    new_dict["team"]["role_bases"] = {**train_cfg.team.role_bases, cfg.role: base_name}
    new_cfg = TrainConfig.from_dict(new_dict)
    _copy_run(run_dir, out)
    new_cfg.to_yaml(out / "config.yaml")
    save_peft_adapter(engine.model(base_name), role.adapter, adapter_dir(out, role.adapter, new_version))
    _write_probes(out, probes)

    state = dict(ckpt.state)
    run_state = dict(state["run"])
    metrics = MetricsLog(out)
    metrics.truncate_to_bytes(state["metrics_bytes"])
    run_state["betas"] = {**run_state["betas"], cfg.role: train_cfg.trust_region.beta_init}
    # the next stage's "before" is the swapped team: its return replaces the last entry (one entry per
    # stage boundary, as the trainer pairs them with certificates); the incumbent's stays in the swap record
    run_state["evals"] = [*run_state["evals"][:-1], after]
    c = certificate_constant(train_cfg.certificate.gamma, train_cfg.loss.adv_clip)
    result = SwapResult(
        out_dir=out,
        role=cfg.role,
        base_name=base_name,
        divergence=aligner.mode,
        probes=len(probes),
        kl_history=history,
        converged=converged,
        new_version=new_version,
        eval_before=before["accuracy"],
        eval_after=after["accuracy"],
        rounds=rounds,
        sampled_tokens=aligner.sampled_tokens,
        extra={
            "align": cfg.align,
            "target": cfg.target,
            "delta0": cfg.delta0,
            "newcomer": str(newcomer_path),
            "from_run": str(run_dir.resolve()),
            # the swap's term in the certificate's form: c * sqrt(KL) for the newcomer's move
            "certificate_penalty": c * math.sqrt(max(history[-1], 0.0)),
            # protocol unification: the newcomer's NLL of the incumbent's messages, before and after
            "unify_nll": aligner.unify_nll,
        },
    )
    step = int(run_state["step"])
    metrics.log("swap", step, stage=int(state["next_stage"]) - 1, **result.to_dict())
    metrics.log("eval", step, stage=int(state["next_stage"]) - 1, label="after swap", **after)
    metrics.close()
    state["run"] = run_state
    state["versions"] = {**state["versions"], role.adapter: new_version}
    state["metrics_bytes"] = (out / METRICS_FILE).stat().st_size
    adapters = {a: w for a, w in ckpt.adapters.items() if not a.startswith("stage0/") and a != role.adapter}
    adapters[role.adapter] = engine.snapshot_adapter(role.adapter, base_name)
    optimizers = {a: o for a, o in ckpt.optimizers.items() if a != role.adapter}  # the newcomer's: fresh
    shutil.rmtree(out / CHECKPOINTS, ignore_errors=True)
    save_checkpoint(
        out, step, Checkpoint(state=state, adapters=adapters, optimizers=optimizers, rng=ckpt.rng, batches={})
    )
    return result


def _fresh_base_name(role: str, cfg: TrainConfig) -> str:
    k = 1
    while f"{role}-swap{k}" in cfg.team.bases:
        k += 1
    return f"{role}-swap{k}"


def _copy_run(src: Path, dst: Path) -> None:
    """The old run's files (adapters of every version, metrics, TensorBoard) become the new run's history."""
    dst.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.name in (CHECKPOINTS, "swap"):
            continue
        target = dst / item.name
        if item.is_dir():
            shutil.copytree(item, target, dirs_exist_ok=True)
        else:
            shutil.copy2(item, target)


def _write_probes(out: Path, probes: list[Probe]) -> None:
    import json

    from teamtr.graphs.chat_format import to_chat_dicts

    (out / "swap").mkdir(exist_ok=True)
    with open(out / "swap" / "probes.jsonl", "w") as f:
        for p in probes:
            f.write(json.dumps({"messages": to_chat_dicts(p.messages), "incumbent": p.incumbent_text}) + "\n")


def direct_and_aligned(
    run_dir: str | Path, cfg: SwapConfig, out_root: Path, callbacks: Callbacks | None = None
) -> dict[str, SwapResult]:
    """Both paths of the swap-shock benchmark from one run: a direct swap and Stage-0."""
    results = {}
    for name, align in (("direct", False), ("stage0", True)):
        results[name] = swap_role(
            run_dir, dataclasses.replace(cfg, align=align, out=str(out_root / name)), callbacks
        )
    return results


__all__ = [
    "Aligner",
    "Callbacks",
    "Probe",
    "Side",
    "SwapConfig",
    "SwapResult",
    "build_probes",
    "swap_role",
    "direct_and_aligned",
]
