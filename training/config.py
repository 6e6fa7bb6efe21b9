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
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from teamtr.training.stage import ScheduleConfig

LossKind = Literal["teamtr", "ppo", "grpo", "dapo"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TaskConfig(_Strict):
    """Which task family the team solves and how training / held-out prompts are drawn."""

    name: str = "chain"  # a name in teamtr.evals.tasks
    options: dict[str, Any] = Field(default_factory=dict)  # constructor options of the task family
    train_seed: int = 1  # prompts for rollouts come from this generator seed ...
    eval_seed: int = 2_000_003  # ... held-out evaluation prompts from a disjoint one
    # where a user graph's tasks come from instead of the family `name` (docs/graphs.md): a JSONL file (one
    # task a line: `prompt` or a graph `input`, optional `answer` and `id`) or `module:function` returning
    # a TaskFamily or a list of TaskInstance; None = the task family `name`
    data: str | None = None


class TeamConfig(_Strict):
    """The team being trained: a factory `module:function` returning the list of `Role`s, who speaks when
    (`router`: round-robin in role order by default, as in graphs/team.py), and the base model every
    role's adapter sits on."""

    # `module:function` returning list[Role]; None = the task's own team: the chain adders for `chain`,
    # else three generic solvers with the family's system prompt (the team `teamtr warmstart` trains)
    roles: str | None = None
    # `module:function`: a router of graphs/team.py (a function of the team state returning the next role
    # or END, declaring its destinations by a `Literal[...]` return annotation); None = round-robin. The
    # run's rollouts, evaluations, swap and `teamtr serve RUN_DIR` all take turns by it (training/run_dir.py)
    router: str | None = None
    max_turns: int | None = Field(None, ge=1)  # episode length guard; None = graphs/team.py's default
    # A user's own LangGraph graph instead of Team (docs/graphs.md): `module:factory`, a compiled graph or
    # a builder `factory(models: RoleModels) -> compiled graph` whose nodes call `models.model(role)`.
    # None = the turn-taking Team of `roles` (and `router`). The keys below apply only with a graph.
    graph: str | None = None
    # `module:function` (task: TaskInstance) -> the graph's input; None = a JSONL row's `input`, else
    # LangGraph's MessagesState: {"messages": [the task prompt as a HumanMessage]}
    input: str | None = None
    # `module:function` (final state) -> the final answer text; None = the last AI message's text
    output: str | None = None
    # `module:function` (task, final state) -> float reward; None = the task family's verifier
    reward: str | None = None
    # sigma: the roles in the order TeamTR updates them each stage (schedule.order then fixes, reverses or
    # shuffles it); None = the order `roles` lists them in
    order: list[str] | None = None
    recursion_limit: int | None = Field(None, ge=1)  # a graph episode's LangGraph step limit; None = 25
    model: str | None = None  # base model directory; None = the task's cached warm-started model
    # with model: None, how that warm-started model is built: overrides of the task's WarmStartConfig
    # (training/warmstart/config.py), e.g. {stop_accuracy: 0.45, seed: 1}; {} = the task's own settings
    warm_start: dict[str, Any] = Field(default_factory=dict)
    # heterogeneous teams: more base models (name -> directory) beside `model` (which is named "base"),
    # and which base each role's adapter sits on (role -> base name; default: the Role's base_model)
    bases: dict[str, str] = Field(default_factory=dict)
    role_bases: dict[str, str] = Field(default_factory=dict)
    lora_rank: int = 8
    lora_alpha: int = 16
    lora_targets: list[str] | None = None  # module names; None = the engine's default (every linear layer)
    # where the embedded engine loads the base models (serving/devices.py): auto = the first GPU in
    # bfloat16 when torch sees one, else the CPU in float32; a GPU asked for where none exists fails early
    device: str = "auto"  # auto | cpu | cuda | cuda:K
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"

    @field_validator("warm_start")
    @classmethod
    def _known_warm_start_fields(cls, v: dict[str, Any]) -> dict[str, Any]:
        from teamtr.training.warmstart.config import WarmStartConfig

        unknown = sorted(set(v) - set(WarmStartConfig.__dataclass_fields__))
        if unknown:
            raise ValueError(f"team.warm_start: unknown WarmStartConfig fields {unknown}")
        return v


class RolloutConfig(_Strict):
    """ROLLOUT step of Algorithm 1: B prompts x G episodes of the current intermediate team."""

    prompts_per_update: int = Field(16, ge=1)  # B
    group_size: int = Field(8, ge=2)  # G: episodes per prompt (group-normalised advantages need >= 2)
    # sampling temperature of the rollouts: the trainer trains pi_T = softmax(logits / T) at this T (its
    # log pi_cur / pi_new are computed at T); turns sampled otherwise are refused (training/behaviour.py)
    temperature: float = Field(1.0, gt=0)
    # who samples the rollouts: the trainer's embedded engine, or a vLLM server (training/vllm_rollouts.py)
    # to which each accepted adapter version is pushed; the update's log-probs are the trainer's either way
    engine: Literal["embedded", "vllm"] = "embedded"
    vllm_url: str | None = None  # vllm: attach to this server (serving the run's base model); None: launch
    vllm_args: list[str] = Field(default_factory=list)  # vllm, launched: extra server arguments
    vllm_env: dict[str, str] = Field(default_factory=dict)  # ... and environment (CUDA_VISIBLE_DEVICES)
    # several servers (serving/vllm_replicas.py, docs/scale.md): attach these replicas (one base), or
    # launch `vllm_replicas` per base, each over tensor x pipeline parallel GPUs
    vllm_urls: list[str] = Field(default_factory=list)
    vllm_replicas: int = Field(1, ge=1)
    vllm_tensor_parallel_size: int = Field(1, ge=1)
    vllm_pipeline_parallel_size: int = Field(1, ge=1)
    vllm_replica_devices: list[str] = Field(default_factory=list)  # CUDA_VISIBLE_DEVICES per replica


class LossConfig(_Strict):
    """The surrogate and the advantage estimator.

    teamtr  message-level ratio exp(sum_u log pi_new/pi_cur), mean over messages (docs/training.md eq. 10)
    ppo     per-token ratio, token mean per message, batch-normalised advantages (no groups)
    grpo    per-token ratio, token mean per message, group-normalised advantages
    dapo    per-token ratio, clip-higher (eps_high 0.28), drop zero-spread groups, token-level mean
    """

    kind: LossKind = "teamtr"
    clip_eps: float = Field(0.2, gt=0)  # eps: ratio clipped to [1 - eps, 1 + eps_high]
    clip_eps_high: float | None = None  # None = clip_eps (dapo defaults it to 0.28)
    adv_clip: float = Field(3.0, gt=0)  # A_clip = A_max of the certificate
    adv_eps: float = Field(1e-6, gt=0)  # eps in sqrt(var + eps)
    group_normalise: bool = True  # False: A = R - group mean (ablation "no group normalisation")
    clip_advantages: bool = True  # False: ablation "no advantage clip" (A_max is then the observed max)
    dynamic_sampling: bool | None = None  # drop groups with zero reward spread; None = (kind == dapo)

    @model_validator(mode="after")
    def _variant_defaults(self) -> LossConfig:
        if self.clip_eps_high is None:
            self.clip_eps_high = 0.28 if self.kind == "dapo" else self.clip_eps
        if self.dynamic_sampling is None:
            self.dynamic_sampling = self.kind == "dapo"
        return self

    @property
    def message_ratio(self) -> bool:
        return self.kind == "teamtr"

    @property
    def token_level_aggregation(self) -> bool:
        return self.kind == "dapo"


class OptimConfig(_Strict):
    """OPTIMISE step: inner epochs of AdamW over minibatches of the role's messages (one optimizer per
    adapter: a shared one would move inactive adapters through their momentum)."""

    lr: float = Field(2e-4, gt=0)
    epochs: int = Field(4, ge=1)  # inner epochs over the update's batch
    minibatch_messages: int = Field(64, ge=1)
    max_grad_norm: float = Field(1.0, gt=0)
    weight_decay: float = Field(0.0, ge=0)


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
    max_backtracks: int = Field(3, ge=0)  # K
    # Out-of-sample monitor (not enforced): before each update, this many held-out episodes of the
    # current team (own prompts and seeds, never trained on); after it, the exact vocabulary-sum
    # KL(pi_cur || pi_new) per message of the updated role on them (`kl_out_of_sample`). 0 = off.
    monitor_episodes: int = Field(8, ge=0)


class CertificateConfig(_Strict):
    """Constants of the certificate proxy C = sum_i [L_hat_i - c sqrt(d_hat_i) - zeta_hat_i / (1-gamma)],
    c = sqrt(2) gamma A_max / (1-gamma)^2. A diagnostic: with gamma near 1 the absolute bound is vacuous."""

    gamma: float = Field(0.5, gt=0, lt=1)


class EvalConfig(_Strict):
    """Held-out evaluation: team return before/after every stage (realised improvement)."""

    stage_episodes: int = Field(128, ge=0)  # per-stage realised-improvement batch (0 = skip)
    final_episodes: int = Field(300, ge=1)  # before/after of the whole run
    temperature: float = Field(0.0, ge=0)  # 0 = greedy, how a served team answers


class TrainConfig(_Strict):
    """A whole run. `run_dir` receives config.yaml, metrics.jsonl, TensorBoard events, adapters/ and
    the resume checkpoint."""

    seed: int = 0
    stages: int = Field(6, ge=1)
    run_dir: str = "runs/teamtr"
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
    def _graph_keys_need_a_graph(self) -> TrainConfig:
        used = [k for k in ("input", "output", "reward", "order", "recursion_limit") if getattr(self.team, k)]
        if used and self.team.graph is None:
            raise ValueError(f"team.{used[0]} applies to a user graph only: set team.graph (module:factory)")
        if self.team.graph is not None and self.team.router is not None:
            raise ValueError("team.router routes teamtr's Team; a user graph (team.graph) routes itself")
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
        return TrainConfig.from_dict(merge(self.to_dict(), overrides))


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
