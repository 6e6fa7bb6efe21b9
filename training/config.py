"""One typed configuration for a TeamTR run, with documented defaults, loadable from YAML.

    cfg = TrainConfig.from_yaml("examples/teamtr.yaml")

Every field has a default; a YAML file names only what it changes. Unknown keys are an error (a typo
must not silently fall back to a default). The schedule is `training/stage.py`'s `ScheduleConfig`.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from teamtr.engines.open import EngineKind, VLLMSettings
from teamtr.graphs.run_layout import DEFAULT_RUN_DIR
from teamtr.graphs.spec import TaskConfig, TeamConfig
from teamtr.training.stage import ScheduleConfig

LossKind = Literal["message_ratio", "ppo_batch_baseline", "grpo", "dapo"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RolloutConfig(VLLMSettings, _Strict):
    """ROLLOUT step of Algorithm 1: B prompts x G episodes of the current intermediate team."""

    prompts_per_update: int = Field(16, ge=1)  # B
    group_size: int = Field(8, ge=2)  # G: episodes per prompt (group-normalised advantages need >= 2)
    # sampling temperature of the rollouts: the trainer trains pi_T = softmax(logits / T) at this T (its
    # log pi_cur / pi_new are computed at T); turns sampled otherwise are refused (training/behaviour.py)
    temperature: float = Field(1.0, gt=0)
    # who samples the rollouts (a kind of engines/open.py ENGINE_KINDS): the trainer's embedded engine, or a
    # vLLM server (training/vllm_rollouts.py) to which each accepted adapter version is pushed; the update's
    # log-probs are the trainer's either way
    engine: EngineKind = "embedded"
    # balance each stage's B prompts over the task's strata when it declares them (graphs/task.py
    # `balanced_prompts`: relay's private value), so a batch covers the contexts later turns depend on;
    # False: B independent draws (as before 2026-12)
    stratify: bool = True
    # vllm: vllm_url, vllm_args, vllm_env, vllm_urls, vllm_replicas, ... (engines/open.py VLLMSettings)


class LossConfig(_Strict):
    """The surrogate and the advantage estimator.

    message_ratio  message-level ratio exp(sum_u log pi_new/pi_cur), mean over messages (docs/training.md
            eq. 10): TeamTR's surrogate
    ppo_batch_baseline  per-token ratio, token mean per message, batch-normalised advantages (no groups):
            PPO's clipped surrogate with the batch mean as baseline, no value function (hence the name)
    grpo    per-token ratio, token mean per message, group-normalised advantages
    dapo    per-token ratio, clip-higher (eps_high 0.28), drop zero-spread groups, token-level mean
    """

    kind: LossKind = "message_ratio"
    clip_eps: float = Field(0.2, gt=0)  # eps: ratio clipped to [1 - eps, 1 + eps_high]
    clip_eps_high: float | None = None  # None = clip_eps (dapo defaults it to 0.28)
    adv_clip: float = Field(3.0, gt=0)  # A_clip = A_max of the certificate
    adv_eps: float = Field(1e-6, gt=0)  # eps in sqrt(var + eps)
    # The baseline of A (docs/training.md, "Advantages"): rloo = R_g - mean of the group's other returns
    # (Dr. GRPO / RLOO: no std division, so a lone failure among 16 weighs 1, not 3); group_normalised =
    # (R_g - mean) / sqrt(var + eps), the paper's (the default before 2026-12); centred = R_g - mean
    # (ablation "no group normalisation"). None = rloo for message_ratio, group_normalised for grpo / dapo
    # (their definition)
    advantage: Literal["rloo", "group_normalised", "centred"] | None = None
    # an update needs reward spread in at least this many prompt groups, else it is skipped (no_signal);
    # 2 or more keeps one discordant episode in a batch from moving a role on its own
    min_signal_groups: int = Field(1, ge=1)
    clip_advantages: bool = True  # False: ablation "no advantage clip" (A_max is then the observed max)
    # per-role credit: "episode" gives every message of role j its episode's advantage against the prompt
    # group (`advantage`), so a role is blamed for what earlier roles did; "prefix" measures it against the
    # mean return of `credit_samples` continuations of the current team from the episode's prefix before
    # j's first turn (training/advantages.py `prefix_advantages`): only what followed j's own prefix
    # counts. Costs credit_samples partial episodes per episode; needs a Team that restarts from a prefix
    credit: Literal["episode", "prefix"] = "episode"
    credit_samples: int = Field(4, ge=1)
    # drop groups with zero reward spread and refill the batch with further groups of the same team
    # (training/llm_team.py); None = (kind == dapo)
    dynamic_sampling: bool | None = None
    # the fields above left None and filled from `kind`: with_overrides re-derives them for a new kind
    _derived: frozenset[str] = PrivateAttr(default=frozenset())

    @model_validator(mode="after")
    def _variant_defaults(self) -> LossConfig:
        derived = {
            name for name in ("clip_eps_high", "dynamic_sampling", "advantage") if getattr(self, name) is None
        }
        if self.advantage is None:
            self.advantage = "rloo" if self.kind == "message_ratio" else "group_normalised"
        if self.clip_eps_high is None:
            self.clip_eps_high = 0.28 if self.kind == "dapo" else self.clip_eps
        if self.dynamic_sampling is None:
            self.dynamic_sampling = self.kind == "dapo"
        if derived:  # (assignments above validate again, with nothing left None: keep the first set)
            self._derived = frozenset(derived)
        if self.credit == "prefix" and (self.dynamic_sampling or self.kind == "ppo_batch_baseline"):
            raise ValueError(
                "loss.credit 'prefix' replaces the group baseline: it cannot be combined with dynamic "
                "sampling (dapo) or the batch baseline (ppo_batch_baseline)"
            )
        return self

    @property
    def message_ratio(self) -> bool:
        return self.kind == "message_ratio"

    @property
    def token_level_aggregation(self) -> bool:
        return self.kind == "dapo"


class OptimConfig(_Strict):
    """OPTIMISE step: inner epochs of `optimizer` over minibatches of the role's messages (one optimizer per
    adapter: a shared one would move inactive adapters through their momentum)."""

    lr: float = Field(2e-4, gt=0)
    # adamw's first step on a fresh adapter is lr * sign(g) on every weight whatever its evidence; radam
    # (rectified Adam) takes momentum-SGD steps until its variance estimate is usable, so the optimiser
    # gives the direction and `trust_region.extrapolate` the length. radam + extrapolate + a 64-episode
    # probe passed the demo's 5-seed rule (benchmarks/results/trainer_check/README.md)
    optimizer: Literal["adamw", "radam"] = "radam"
    epochs: int = Field(4, ge=1)  # inner epochs over the update's batch
    minibatch_messages: int = Field(64, ge=1)
    max_grad_norm: float = Field(1.0, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    # log-prob passes (training/policy.py): at most this many padded prompt + completion tokens per forward
    # pass (messages x the longest among them, at most 64 messages); activations grow with it, not with the
    # minibatch (one spanning several passes is backpropagated pass by pass). 16,384 keeps 64 messages per
    # pass on the small models, 16 at 1,024 tokens
    logprob_token_budget: int = Field(16_384, ge=1)
    # recompute the model body's activations in the backward pass instead of keeping them (about a third
    # more compute): for large models (docs/models.md, "The GPU path")
    gradient_checkpointing: bool = False
    # the log-prob passes under bfloat16 autocast when the model is on a CUDA device (ignored on the CPU)
    bf16_autocast: bool = True


class TrustRegionConfig(_Strict):
    """MONITOR step: keep d_hat_i = mean over messages of sum_u log(pi_cur/pi_new) <= delta (eq. 11).

    adaptive penalty: beta *= beta_factor when d_hat > delta * 1.5, /= beta_factor when d_hat < delta / 1.5
    early stop:      stop the inner epochs as soon as d_hat exceeds delta
    backtracking:    an update that ends outside delta is undone (adapter restored exactly) and retried
                     with lr / 2 and beta * 2, at most `max_backtracks` times; then it is rejected
    """

    enabled: bool = True  # False: ablation "no trust region" (d_hat still measured and logged)
    delta: float = Field(0.01, gt=0)
    per_token: bool = False  # True: the constraint is on the per-token mean instead of the message sum
    # Which estimate of KL(pi_cur || pi_new) over the sampled tokens is constrained and penalised:
    # k3 = (r - 1) - log r, r = pi_new / pi_cur (>= 0 per token; its gradient is zero at pi_new = pi_cur);
    # k1 = log pi_cur - log pi_new, eq. 11 literally. Both have the right expectation, but on the tokens an
    # update was fitted on, k1 goes negative while the policy moves far (docs/training.md, "Trust region"),
    # and as a penalty its gradient raises the probability of the sampled tokens.
    # Both are logged for every update whichever is chosen.
    estimator: Literal["k1", "k3"] = "k3"
    penalty: Literal["adaptive", "fixed", "none"] = "adaptive"
    beta_init: float = Field(1.0, ge=0)
    beta_factor: float = Field(2.0, gt=1)
    beta_min: float = 1e-3
    beta_max: float = 1e3
    early_stop: bool = True
    max_backtracks: int = Field(3, ge=0)  # K (check: sampled only)
    # Where the region is enforced (docs/training.md, "Trust region"):
    # probe    exact vocabulary-sum KL per message, checked after every optimiser step on the batch's
    #          contexts AND on `probe_episodes` fresh held-out episodes of the current team; a step whose
    #          KL (the probe's upper confidence bound at `probe_confidence`) would pass delta is line-searched
    #          back along its direction and the update ends there: the last iterate is always inside
    # sampled  k3 / k1 over the batch's own sampled tokens after every epoch, restore-and-halve
    #          backtracking (the behaviour before 2026-12: leaks out of sample, measured in the docs)
    check: Literal["probe", "sampled"] = "probe"
    # the exact KL the probe check constrains: forward KL(pi_cur || pi_new) (eq. 11), reverse
    # KL(pi_new || pi_cur) (charges new tail mass), or max = the larger of both per message
    direction: Literal["forward", "reverse", "max"] = "max"
    # What eq. 10's penalty beta * d_hat charges (probe check only): `sampled` = the estimator above on the
    # batch's own sampled tokens (a forward-KL estimate: it barely sees mass moved to tokens nobody
    # sampled); `exact` = the KL the check constrains (`direction`, vocabulary sums on the batch's contexts),
    # so the optimiser's direction pays for new tail mass as the region does
    penalty_kl: Literal["sampled", "exact"] = "sampled"
    # held-out episodes per update whose role-j contexts form the probe: 16 did not hold the KL's tail over
    # contexts once steps were extrapolated towards delta (the demo's rule, 8.3% beyond delta); 64 did
    probe_episodes: int = Field(64, ge=1)
    probe_confidence: float = Field(0.9, gt=0.5, lt=1)  # one-sided level of the probe's mean-KL bound
    # How far back a step that would leave is searched (probe check): `halving` (default) tries 1/2, 1/4, ...
    # of it and keeps the first inside (KL being about quadratic in the step, a kept half-step holds about a
    # quarter of the overshoot's KL); `bracket` finds the farthest fraction inside by interpolating sqrt(KL),
    # about linear along a line, towards `line_search_target` * delta, so the update ends near the boundary.
    # bracket was the default for one trial: on the demo (seeds 0-2) its gains were +2.0 / +7.3 / +7.3 where
    # halving's were +13.7 / +14.7 / +9.0, and 11% of its updates ended beyond delta out of sample
    # (benchmarks/results/trainer_check/README.md)
    line_search: Literal["bracket", "halving"] = "halving"
    line_search_target: float = Field(0.9, gt=0, le=1)  # bracket, extrapolate: the KL aimed at, in delta
    line_search_steps: int = Field(6, ge=0)  # points of the last step tried before stopping at pi_prev
    # probe check: an update whose epochs all ended inside has its whole displacement from pi_cur scaled by
    # s = sqrt(line_search_target * delta / KL) (KL about quadratic in it), at most `extrapolate_max`, then
    # line-searched back towards the unscaled end if the scaled point is outside: the step's length is set
    # by the KL, not by the lr (TRPO's step along the optimiser's direction). Off: the lr sets it
    extrapolate: bool = True
    extrapolate_max: float = Field(8.0, gt=1)  # per round
    # rounds of scaling, each from the last point inside and only while the previous one was capped: a
    # short step (RAdam's first steps on SmolLM2 at lr 2.5e-4 end near 1e-5 nats) reaches the boundary in a
    # few measured jumps. 1 by default: 3 rounds failed the demo's rule by one update (7 of 120 beyond
    # delta, benchmarks/results/trainer_check/README.md); on such models give it 3 or raise the lr
    extrapolate_rounds: int = Field(1, ge=1)
    # Held-out KL check (measured, never enforced: a set independent of batch and probe): before each
    # update, this many held-out episodes of the current team (own prompts and seeds, never trained on);
    # after it, the exact KL per message of the updated role on them (`delta_eff`). 0 = off. At 8 the
    # mean of a right-skewed per-message KL read steps at 0.6 delta as beyond delta 17% of the time; 64
    # agrees with the probe (benchmarks/results/trainer_check/README.md)
    heldout_episodes: int = Field(64, ge=0)

    @model_validator(mode="after")
    def _exact_penalty_needs_probe(self) -> TrustRegionConfig:
        if self.penalty_kl == "exact" and (self.check != "probe" or not self.enabled):
            raise ValueError(
                "trust_region.penalty_kl 'exact' measures the KL the probe check constrains: it needs "
                "trust_region.check 'probe' and the region enabled"
            )
        return self


class CertificateConfig(_Strict):
    """Constants of the certificate proxy C = sum_i [L_hat_i - c sqrt(d_hat_i) - zeta_hat_i / (1-gamma)],
    c = sqrt(2) gamma A_max / (1-gamma)^2. A diagnostic: with gamma near 1 the absolute bound is vacuous."""

    gamma: float = Field(0.5, gt=0, lt=1)


class EvalConfig(_Strict):
    """Held-out evaluation: team return before/after every stage (realised improvement)."""

    stage_episodes: int = Field(128, ge=0)  # per-stage realised-improvement batch (0 = skip)
    final_episodes: int = Field(300, ge=1)  # before/after of the whole run
    temperature: float = Field(0.0, ge=0)  # 0 = greedy, how a served team answers
    # a stage whose held-out return is below the best earlier stage's by more than 2 standard errors is
    # undone: every role gets the best stage's weights back (training/stage_safety.py); needs stage_episodes
    keep_best: bool = True


class TrainConfig(_Strict):
    """A whole run. `run_dir` receives config.yaml, metrics.jsonl, TensorBoard events, adapters/ and
    the resume checkpoint."""

    seed: int = 0
    stages: int = Field(6, ge=1)
    run_dir: str = DEFAULT_RUN_DIR
    torch_threads: int = Field(1, ge=1)
    # stop at the first stage boundary where the training rollouts used this many completion tokens
    # (compares schedules at an equal rollout-token budget); None = run all `stages`
    max_rollout_tokens: int | None = None
    task: TaskConfig = Field(default_factory=TaskConfig)
    team: TeamConfig = Field(default_factory=TeamConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    trust_region: TrustRegionConfig = Field(default_factory=TrustRegionConfig)
    certificate: CertificateConfig = Field(default_factory=CertificateConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)

    @model_validator(mode="after")
    def _known_warm_start_fields(self) -> TrainConfig:
        from teamtr.training.warmstart.config import WarmStartConfig

        unknown = sorted(set(self.team.warm_start) - set(WarmStartConfig.__dataclass_fields__))
        if unknown:
            raise ValueError(f"team.warm_start: unknown WarmStartConfig fields {unknown}")
        return self

    @model_validator(mode="after")
    def _graph_keys_need_a_graph(self) -> TrainConfig:
        used = [k for k in ("input", "output", "reward", "order", "recursion_limit") if getattr(self.team, k)]
        if used and self.team.graph is None:
            raise ValueError(f"team.{used[0]} applies to a user graph only: set team.graph (module:factory)")
        if self.team.graph is not None and self.team.router is not None:
            raise ValueError("team.router routes teamtr's Team; a user graph (team.graph) routes itself")
        return self

    @model_validator(mode="after")
    def _baselines_fit(self) -> TrainConfig:
        """The joint update and the shared adapter take only what they are defined with (docs/training.md)."""
        joint, tr = self.schedule.kind == "joint", self.trust_region
        if joint and tr.enabled and tr.check != "probe":
            raise ValueError("schedule joint holds each role's region by the probe check: trust_region.check probe")
        if joint and self.loss.kind != "message_ratio":
            raise ValueError("schedule joint's objective is the team's trajectory ratio: loss.kind message_ratio")
        if self.loss.credit == "prefix" and (joint or self.team.shared_adapter):
            raise ValueError(
                "loss.credit prefix credits one role from its own prefix: not with schedule joint (one "
                "advantage per episode for the team) or team.shared_adapter (one policy for every role)"
            )
        if joint and self.team.shared_adapter:
            raise ValueError("team.shared_adapter trains one policy: there is no team to update jointly")
        if joint and tr.penalty_kl == "exact":
            raise ValueError("trust_region.penalty_kl exact is the per-agent step's, not schedule joint's")
        return self

    @field_validator("schedule", mode="before")
    @classmethod
    def _schedule(cls, v: Any) -> ScheduleConfig:
        if isinstance(v, ScheduleConfig):
            return v
        if not isinstance(v, dict):
            raise ValueError("schedule must be a mapping (kind, resample_every, resample, order, diagnose_stale_gap)")
        known = set(ScheduleConfig.__dataclass_fields__)
        unknown = set(v) - known
        if unknown:
            raise ValueError(f"unknown schedule keys {sorted(unknown)}; known: {sorted(known)}")
        return ScheduleConfig(**v)

    # --- I/O -------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = self.model_dump(exclude={"schedule"})
        d["schedule"] = asdict(self.schedule)
        return d

    def to_yaml(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        return cls.model_validate(d)

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file {path} does not exist")
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: the top level must be a mapping")
        return cls.from_dict(merge(data, overrides or {}))

    def with_overrides(self, overrides: dict[str, Any]) -> TrainConfig:
        """This config with `overrides` merged in; the loss fields derived from `loss.kind` are derived
        again (`loss.kind=dapo` gets dapo's clip_eps_high and dynamic sampling, as from_dict gives)."""
        base = self.to_dict()
        for name in self.loss._derived:
            base["loss"][name] = None
        return TrainConfig.from_dict(merge(base, overrides))


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Recursive dict merge; dotted keys ('loss.kind') address nested fields."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for key, value in overrides.items():
        head, _, rest = key.partition(".")
        if rest:
            out[head] = merge(out.get(head) or {}, {rest: value})
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out
