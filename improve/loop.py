"""The improve loop, step by step, with its progress in `WORK_DIR/state.json` (docs/improve.md):

    collect    served episodes of the team (a window) -> train / held-out prompts; the versions served
               now are the incumbent (recorded); the judges of gate and canary (judge.py)
    train      TeamTR from the incumbent on the training prompts (train.py; checkpointed)
    gate       held-out paired test + every role's KL to the incumbent (gate.py) -> refused, or
    stage      candidate versions loaded on the server beside the incumbent, never current
    canary     a share of new episodes on the candidate, rewards compared (canary.py) -> decision
    decide     promote every role at once, or abandon the candidate (roll back)

Each step is recorded before the next starts, and every server-side step checks the server first
(is our candidate still loaded? was it promoted already?), so a run killed anywhere and started again
continues from the step it was in, or with `abandon=True` drops the candidate cleanly; the registry's
promotion is one atomic step, so no team is ever half-promoted. The loop's decisions and their figures
go to `WORK_DIR/decisions.jsonl`; what the server loaded, promoted and rolled back goes to the run's
promotion log, which the server itself writes (serving/promotion_log.py).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from teamtr.client.admin_client import AdminClient
from teamtr.client.admin_protocol import ServedEpisode
from teamtr.graphs.run_layout import append_record
from teamtr.graphs.trajectory import load_jsonl
from teamtr.improve.canary import CanaryConfig, decide, paired_by_prompt, tally
from teamtr.improve.data import (
    ImproveDataError,
    RewardFn,
    ServedTasks,
    function_reward,
    select_episodes,
    split_prompts,
    verifier_reward,
)
from teamtr.improve.feedback import FEEDBACK_FILE, collect_feedback, no_fresh_reward
from teamtr.improve.gate import GateConfig, run_gate, trust_region_reach
from teamtr.improve.judge import AUTO, FEEDBACK, Judges, resolve_judges
from teamtr.improve.llm_judge import open_judge
from teamtr.improve.stats import sizing
from teamtr.improve.train import FeedbackTraining, improve_config, train_candidate
from teamtr.serving.served_episodes import feedback_trajectories, served_episodes
from teamtr.training.run_dir import RunDir

STATE_FILE = "state.json"
LOG_FILE = "decisions.jsonl"


@dataclass
class ImproveConfig:
    run_dir: str  # the served run (its roles, config, base model)
    work_dir: str  # state, improve runs and the promotion log
    team: str  # the served team's name
    url: str
    admin_key: str | None = None
    traces: str | None = None  # read served episodes from this span store instead of GET /admin/episodes
    last: int | None = None  # the newest N episodes ...
    since_s: float | None = None  # ... or those of the last S seconds
    held_out_fraction: float = 0.5  # 0.25 refused 2 of 4 truly better candidates (docs/improve.md)
    # the training reward: verifier | verifier:TASK | module:function | judge:FILE | feedback (served
    # exploratory episodes' /v1/feedback alone: feedback.py)
    reward: str = "verifier"
    train_on_feedback: bool = False  # also train on the feedback episodes, mixed with the fresh rollouts
    feedback_cap: float = 1.0  # the truncation of the feedback episodes' importance weights (feedback.py)
    judge_model: str | None = None  # judge:FILE: the judge's base model (default: the served run's)
    judge_url: str | None = None  # ... or the vLLM server serving it
    # the judges (judge.py): auto | verifier | verifier:TASK | module:function (| feedback: canary only)
    gate_judge: str = AUTO
    canary_judge: str = AUTO
    allow_training_reward_judge: bool = False  # let the training reward judge when nothing else can
    train: dict[str, Any] = field(default_factory=dict)  # improve run settings (dotted keys of TrainConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    canary: CanaryConfig = field(default_factory=CanaryConfig)
    threads: int = 1


def reward_function(spec: str, served: RunDir, judge: Callable[[str], RewardFn] | None = None) -> RewardFn:
    """`judge(file)`: the LLM judge of a `judge:FILE` spec (llm_judge.py)."""
    if spec == "verifier":
        return verifier_reward(served.task())
    if spec.startswith("verifier:"):
        from teamtr.tasks import get_task

        return verifier_reward(get_task(spec.split(":", 1)[1]))
    if spec == FEEDBACK:
        return no_fresh_reward
    if spec.startswith("judge:") and judge is not None:
        return judge(spec.split(":", 1)[1])
    return function_reward(spec)


class ImproveLoop:
    def __init__(self, cfg: ImproveConfig, say: Callable[[str], None] = print) -> None:
        self.cfg, self.say = cfg, say
        self.work = Path(cfg.work_dir)
        self.work.mkdir(parents=True, exist_ok=True)
        self.client = AdminClient(cfg.url, cfg.admin_key)
        self.served = RunDir(cfg.run_dir)
        self._llm_judges: dict[str, RewardFn] = {}
        self.reward = self.reward_of(cfg.reward)
        self._judges: Judges | None = None
        self.role_of = {r.adapter: r.name for r in self.served.roles if r.adapter}
        self._state_id = ""

    def reward_of(self, spec: str) -> RewardFn:
        return reward_function(spec, self.served, self._llm_judge)

    def _llm_judge(self, template: str) -> RewardFn:
        if template not in self._llm_judges:  # one judge engine per prompt file, shared by its uses
            model = self.cfg.judge_model or self.served.model_path()
            self._llm_judges[template], _ = open_judge(template, model, self.cfg.judge_url)
        return self._llm_judges[template]

    @property
    def trains_on_feedback(self) -> bool:
        return self.cfg.reward == FEEDBACK or self.cfg.train_on_feedback

    # ---- state ---------------------------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.work / STATE_FILE

    def load_state(self) -> dict[str, Any] | None:
        return json.loads(self.state_path.read_text()) if self.state_path.is_file() else None

    def save(self, state: dict[str, Any]) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1, default=str))
        with open(tmp) as f:
            os.fsync(f.fileno())
        tmp.replace(self.state_path)  # atomic: a kill leaves the old state or the new one

    def log(self, event: str, state: dict[str, Any], **fields: Any) -> None:
        append_record(
            self.work / LOG_FILE,
            event,
            attempt=state["attempt"],
            team=self.cfg.team,
            run=state["run_dir"],
            incumbent={a: v for a, (v, _) in state["incumbent"].items()},
            candidate=state.get("candidate_versions"),
            data_window=state["window"],
            **fields,
        )

    def judges(self, state: dict[str, Any]) -> Judges:
        if self._judges is None:
            self._judges = resolve_judges(
                self.cfg.reward,
                self.cfg.gate_judge,
                self.cfg.canary_judge,
                task=self.served.config.task.name,
                load=self.reward_of,
                training_reward=self.reward,
                has_feedback=state["has_feedback"],
                allow_training_reward=self.cfg.allow_training_reward_judge,
                trained_on_feedback=self.trains_on_feedback,
            )
        return self._judges

    # ---- the loop ------------------------------------------------------------------------------------
    def run(self, abandon: bool = False) -> dict[str, Any]:
        """One attempt, from wherever the last one stopped; returns the final state."""
        state = self.load_state()
        if abandon:
            return self.abandon(state)
        if state is None or state["phase"] == "done":
            state = self.collect(state)
        steps = {
            "training": self.train_step,
            "gating": self.gate_step,
            "loading": self.load_step,
            "canary": self.canary_step,
            "deciding": self.decide_step,
        }
        while state["phase"] != "done":
            self.say(f"improve {state['attempt']}: {state['phase']}")
            state = steps[state["phase"]](state)
            self.save(state)
        return state

    def episodes(self, since_ns: int = 0, shadows: bool = False) -> list[ServedEpisode]:
        """`shadows`: with the canary's shadow episodes (the incumbent's unreturned answers)."""
        if self.cfg.traces is not None:
            return served_episodes(self.cfg.traces, team=self.cfg.team, since_ns=since_ns, shadows=shadows)
        return self.client.episodes(team=self.cfg.team, since_ns=since_ns, shadows=shadows)

    def feedback_source(self, since_ns: int) -> list[Any]:
        """The exploratory episodes with feedback since `since_ns`, with their turns (dicts or trajectories)."""
        if self.cfg.traces is not None:
            return feedback_trajectories(self.cfg.traces, team=self.cfg.team, since_ns=since_ns)
        return self.client.feedback_episodes(team=self.cfg.team, since_ns=since_ns)

    def collect(self, previous: dict[str, Any] | None) -> dict[str, Any]:
        cfg = self.cfg
        listed = self.client.list_versions()
        if listed.candidate is not None:
            raise ImproveDataError(
                f"the server has a candidate under canary already ({listed.candidate.versions}); wait for it "
                "or abandon it (teamtr improve --abandon)"
            )
        since = time.time_ns() - int(cfg.since_s * 1e9) if cfg.since_s else 0
        episodes = select_episodes(self.episodes(since), last=cfg.last)
        if not episodes:
            raise ImproveDataError(f"no served episodes of team {cfg.team!r} in the window")
        data = split_prompts(episodes, cfg.team, cfg.held_out_fraction)
        has_feedback = any(e.reward is not None for e in episodes)
        judges = self.judges({"has_feedback": has_feedback})  # refused here, before any training
        for note in judges.notes:
            self.say(f"improve: {note}")
        adapters = {r.adapter for r in self.served.roles if r.adapter}
        incumbent = {
            a: (v.version, v.path) for a, vs in listed.roles.items() if a in adapters for v in vs if v.current
        }
        attempt = (previous["attempt"] + 1) if previous else 1
        run_dir = self.work / f"attempt-{attempt}"
        # feedback alone: no reward for a fresh episode, so neither the held-out KL check nor the probe
        # check (both sample fresh episodes of the team) unless asked: the region is checked on the batch
        no_fresh = {"trust_region.heldout_episodes": 0, "trust_region.check": "sampled"}
        settings = {**no_fresh, **cfg.train} if cfg.reward == FEEDBACK else cfg.train
        train_cfg = improve_config(self.served, run_dir, settings)
        feedback = None
        if self.trains_on_feedback:  # the exploratory episodes of the training prompts, saved in the run
            since_feedback = data.window.since_ns
            feedback = collect_feedback(
                self.feedback_source(since_feedback),
                {a: v for a, (v, _) in incumbent.items()},
                train_cfg.rollout.temperature,
                data.train,
                run_dir,
            )
            self.say(f"improve {attempt}: feedback {feedback}")
        state = {
            "attempt": attempt,
            "id": uuid.uuid4().hex[:12],
            "phase": "training",
            "run_dir": str(run_dir),
            "incumbent": incumbent,
            # accepted updates are numbered after every version the server knows (abandoned ones too), so
            # the folder's v<N> is the served and traced version N
            "number_from": {a: max(v.version for v in vs) for a, vs in listed.roles.items() if a in adapters},
            "has_feedback": has_feedback,
            "judges": {"gate": judges.gate_name, "canary": judges.canary_name, "notes": judges.notes},
            "train_prompts": data.train,
            "held_out": data.held_out,
            "window": asdict(data.window),
            "train_config": train_cfg.to_dict(),
            "feedback": feedback,
        }
        self.save(state)
        self.say(f"improve {attempt}: {data.window.describe()}; incumbent {listed.current}")
        distinct = len(data.train) + len(data.held_out)
        g, c = cfg.gate, cfg.canary
        for line in sizing(
            len(data.held_out),
            distinct,
            cfg.held_out_fraction,
            g.confidence,
            c.max_episodes,
            c.share,
            c.confidence,
        ):
            self.say(f"improve {attempt}: {line}")
        return state

    def train_step(self, state: dict[str, Any]) -> dict[str, Any]:
        from teamtr.training.config import TrainConfig

        cfg = TrainConfig.from_dict(state["train_config"])
        task = ServedTasks(state["train_prompts"], self.reward)
        feedback = None
        if state.get("feedback"):
            episodes = list(load_jsonl(Path(state["run_dir"]) / FEEDBACK_FILE))
            feedback = FeedbackTraining(episodes, mix=self.cfg.reward != FEEDBACK, cap=self.cfg.feedback_cap)
        changed, summary = train_candidate(
            self.served, _incumbent(state), cfg, task, state.get("number_from"), feedback
        )
        state["candidate_dirs"] = {a: str(p) for a, (_, p) in changed.items()}
        state["candidate_versions"] = {a: v for a, (v, _) in changed.items()}
        state["certificate"] = {
            "stage_certificates": summary.get("stage_certificates"),
            "updates": summary.get("updates"),
            "rejected_fraction": summary.get("rejected_fraction"),
            "left_region_fraction": summary.get("left_region_fraction"),
        }
        if not changed:
            self.log("no_change", state, decision="abandoned", reason="no role's update moved its policy")
            state["phase"] = "done"
            state["decision"] = "no_change"
            return state
        state["phase"] = "gating"
        return state

    def gate_step(self, state: dict[str, Any]) -> dict[str, Any]:
        from teamtr.training.config import TrainConfig

        cfg = TrainConfig.from_dict(state["train_config"])
        kl_limit = self.cfg.gate.kl_limit
        if kl_limit is None:
            kl_limit = trust_region_reach(cfg.trust_region.delta, cfg.stages)  # one update per role a stage
        result = run_gate(
            self.served,
            _incumbent(state),
            {a: Path(p) for a, p in state["candidate_dirs"].items()},
            state["held_out"],
            ServedTasks(state["held_out"], self.judges(state).gate),
            self.cfg.gate,
            temperature=cfg.rollout.temperature,
            kl_limit=kl_limit,
            threads=self.cfg.threads,
            certificate=state.get("certificate"),
            judge=self.judges(state).gate_name,
        )
        state["gate"] = result.figures()
        self.log("gate", state, decision="passed" if result.passed else "refused", figures=result.figures())
        self.say(f"gate: {'passed' if result.passed else 'refused'}: {'; '.join(result.reasons)}")
        if not result.passed:
            state["phase"], state["decision"] = "done", "refused"
            return state
        state["phase"] = "loading"
        return state

    def _ours(self) -> bool:
        c = self.client.candidate()
        return c is not None and c.lineage.get("attempt_id") == self._state_id

    def load_step(self, state: dict[str, Any]) -> dict[str, Any]:
        self._state_id = state["id"]
        if not self._ours():
            lineage = {
                "run": state["run_dir"],
                "data_window": f"{state['window']['episodes']} episodes, {state['window']['since_ns']}.."
                f"{state['window']['until_ns']}",
                "attempt_id": state["id"],
                "gate": f"{state['gate']['difference']:+.3f} (lower bound {state['gate']['lower_bound']:+.3f}, "
                f"{state['gate']['prompts']} prompts, {state['gate']['test']}, judge {state['gate']['judge']})",
            }
            versions = {a: (state["candidate_dirs"][a], v) for a, v in state["candidate_versions"].items()}
            shadow = paired_by_prompt(self.judges(state).canary)  # feedback cannot judge a shadow's answer
            self.client.load_candidate(versions, lineage, share=self.cfg.canary.share, shadow=shadow)
        state["canary_start_ns"] = time.time_ns()
        state["canary_deadline"] = time.time() + self.cfg.canary.timeout_s
        self.log("canary_started", state, share=self.cfg.canary.share)
        state["phase"] = "canary"
        return state

    def canary_step(self, state: dict[str, Any]) -> dict[str, Any]:
        self._state_id = state["id"]
        if not self._ours():  # the server restarted, or someone else decided: nothing of ours is loaded
            state["phase"], state["decision"] = "deciding", "lost"
            return state
        candidate = state["candidate_versions"]
        incumbent = {a: v for a, (v, _) in state["incumbent"].items() if a in candidate}
        reward = self.judges(state).canary
        while True:
            episodes = self.episodes(state["canary_start_ns"], shadows=True)
            t = tally(episodes, self.role_of, candidate, incumbent, reward)
            verdict = decide(t, self.cfg.canary)
            b = t.bound(self.cfg.canary)
            state["canary"] = {
                **t.figures(),
                "pairs": b.n,
                "lower_bound": b.lower,
                "upper_bound": b.upper,
                "judge": self.judges(state).canary_name,
            }
            if verdict is not None:
                promote, why = verdict
                break
            if time.time() > state["canary_deadline"]:
                promote, why = False, f"no decision within {self.cfg.canary.timeout_s:g} s"
                break
            time.sleep(self.cfg.canary.poll_s)
        state["decision"], state["reason"] = ("promote" if promote else "rollback"), why
        state["phase"] = "deciding"
        self.say(f"canary: {state['decision']}: {why}")
        return state

    def decide_step(self, state: dict[str, Any]) -> dict[str, Any]:
        """Idempotent: a promotion or abandon already done on the server is recognised, not repeated."""
        self._state_id = state["id"]
        candidate = state["candidate_versions"]
        if self._ours():
            if state["decision"] == "promote":
                self.client.promote_candidate()
            else:
                self.client.abandon_candidate(rolled_back=True, reason=state.get("reason"))
        current = self.client.list_versions().current
        promoted = all(current.get(a) == v for a, v in candidate.items())
        outcome = "promoted" if promoted else "rolled_back"
        self.log(
            outcome,
            state,
            decision=outcome,
            reason=state.get("reason"),
            figures=state.get("canary"),
            current=current,
        )
        state["outcome"], state["phase"] = outcome, "done"
        self.say(f"improve {state['attempt']}: {outcome}; serving {current}")
        return state

    def abandon(self, state: dict[str, Any] | None) -> dict[str, Any]:
        """Drop whatever this loop's unfinished attempt loaded; the incumbent keeps serving."""
        if state is None or state["phase"] == "done":
            self.say("nothing to abandon")
            return state or {}
        self._state_id = state["id"]
        if self._ours():
            self.client.abandon_candidate()
        if "window" in state:
            self.log(
                "abandoned", state, decision="abandoned", reason="abandoned on request", phase=state["phase"]
            )
        state["outcome"], state["phase"] = "abandoned", "done"
        self.save(state)
        return state


def _incumbent(state: dict[str, Any]) -> dict[str, tuple[int, str]]:
    return {a: (int(v), str(p)) for a, (v, p) in state["incumbent"].items()}
