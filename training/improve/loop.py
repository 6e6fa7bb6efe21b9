"""The improve loop, step by step, with its progress in `WORK_DIR/state.json` (docs/improve.md):

    collect    served episodes of the team (a window) -> train / held-out prompts; the versions served
               now are the incumbent (recorded)
    train      TeamTR from the incumbent on the training prompts (train.py; checkpointed)
    gate       held-out paired bootstrap + every role's KL to the incumbent (gate.py) -> refused, or
    stage      candidate versions loaded on the server beside the incumbent, never current
    canary     a share of new episodes on the candidate, rewards compared (canary.py) -> decision
    decide     promote every role at once, or abandon the candidate (roll back)

Each step is recorded before the next starts, and every server-side step checks the server first
(is our candidate still staged? was it promoted already?), so a run killed anywhere and started again
continues from the step it was in, or with `abandon=True` drops the candidate cleanly; the registry's
promotion is one atomic step, so no team is ever half-promoted. Decisions go to the promotion log
(serving/promotion_log.py) in the work directory.
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

from teamtr.serving.admin_client import AdminClient
from teamtr.serving.promotion_log import append_record
from teamtr.serving.protocol import ServedEpisode
from teamtr.serving.served_episodes import served_episodes
from teamtr.training.improve.canary import CanaryConfig, decide, tally
from teamtr.training.improve.data import (
    ImproveDataError,
    RewardFn,
    ServedTasks,
    function_reward,
    select_episodes,
    split_prompts,
    verifier_reward,
)
from teamtr.training.improve.gate import GateConfig, run_gate
from teamtr.training.improve.train import improve_config, train_candidate
from teamtr.training.run_dir import RunDir

STATE_FILE = "state.json"
LOG_FILE = "promotions.jsonl"


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
    held_out_fraction: float = 0.25
    reward: str = "verifier"  # verifier | verifier:TASK | module:function
    canary_reward: str = "reward"  # reward (the same function on the served answer) | feedback
    train: dict[str, Any] = field(default_factory=dict)  # improve run settings (dotted keys of TrainConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    canary: CanaryConfig = field(default_factory=CanaryConfig)
    threads: int = 1


def reward_function(spec: str, served: RunDir) -> RewardFn:
    if spec == "verifier":
        return verifier_reward(served.task())
    if spec.startswith("verifier:"):
        from teamtr.evals.tasks import get_task

        return verifier_reward(get_task(spec.split(":", 1)[1]))
    if spec == "feedback":
        raise ImproveDataError(
            "stored feedback scores only the served episodes it was given for; training samples new "
            "episodes, so --reward must be a verifier or module:function (feedback can judge the canary: "
            "--canary-reward feedback)"
        )
    return function_reward(spec)


class ImproveLoop:
    def __init__(self, cfg: ImproveConfig, say: Callable[[str], None] = print) -> None:
        self.cfg, self.say = cfg, say
        self.work = Path(cfg.work_dir)
        self.work.mkdir(parents=True, exist_ok=True)
        self.client = AdminClient(cfg.url, cfg.admin_key)
        self.served = RunDir(cfg.run_dir)
        self.reward = reward_function(cfg.reward, self.served)
        self.role_of = {r.adapter: r.name for r in self.served.roles if r.adapter}
        self._state_id = ""

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
            "staging": self.stage_step,
            "canary": self.canary_step,
            "deciding": self.decide_step,
        }
        while state["phase"] != "done":
            self.say(f"improve {state['attempt']}: {state['phase']}")
            state = steps[state["phase"]](state)
            self.save(state)
        return state

    def episodes(self, since_ns: int = 0) -> list[ServedEpisode]:
        if self.cfg.traces is not None:
            return served_episodes(self.cfg.traces, team=self.cfg.team, since_ns=since_ns)
        return self.client.episodes(team=self.cfg.team, since_ns=since_ns)

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
        adapters = {r.adapter for r in self.served.roles if r.adapter}
        incumbent = {
            a: (v.version, v.path) for a, vs in listed.roles.items() if a in adapters for v in vs if v.current
        }
        attempt = (previous["attempt"] + 1) if previous else 1
        run_dir = self.work / f"attempt-{attempt}"
        train_cfg = improve_config(self.served, run_dir, cfg.train)
        state = {
            "attempt": attempt,
            "id": uuid.uuid4().hex[:12],
            "phase": "training",
            "run_dir": str(run_dir),
            "incumbent": incumbent,
            "train_prompts": data.train,
            "held_out": data.held_out,
            "window": asdict(data.window),
            "train_config": train_cfg.to_dict(),
        }
        self.save(state)
        self.say(f"improve {attempt}: {data.window.describe()}; incumbent {listed.current}")
        return state

    def train_step(self, state: dict[str, Any]) -> dict[str, Any]:
        from teamtr.training.config import TrainConfig

        cfg = TrainConfig.from_dict(state["train_config"])
        task = ServedTasks(state["train_prompts"], self.reward)
        changed, summary = train_candidate(self.served, _incumbent(state), cfg, task)
        state["candidate_dirs"] = {a: str(p) for a, (_, p) in changed.items()}
        state["certificate"] = {
            "stage_certificates": summary.get("stage_certificates"),
            "updates": summary.get("updates"),
            "rejected_fraction": summary.get("rejected_fraction"),
            "left_region_fraction": summary.get("left_region_fraction"),
        }
        if not changed:
            self.log("no_change", state, decision="abandoned", reason="no role's update was accepted")
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
            kl_limit = cfg.trust_region.delta * cfg.stages
        result = run_gate(
            self.served,
            _incumbent(state),
            {a: Path(p) for a, p in state["candidate_dirs"].items()},
            state["held_out"],
            ServedTasks(state["held_out"], self.reward),
            self.cfg.gate,
            temperature=cfg.rollout.temperature,
            kl_limit=kl_limit,
            threads=self.cfg.threads,
            certificate=state.get("certificate"),
        )
        state["gate"] = result.figures()
        self.log("gate", state, decision="passed" if result.passed else "refused", figures=result.figures())
        self.say(f"gate: {'passed' if result.passed else 'refused'}: {'; '.join(result.reasons)}")
        if not result.passed:
            state["phase"], state["decision"] = "done", "refused"
            return state
        known = {a: max(v.version for v in vs) for a, vs in self.client.list_versions().roles.items()}
        state["candidate_versions"] = {a: known[a] + 1 for a in state["candidate_dirs"]}
        state["phase"] = "staging"
        return state

    def _ours(self) -> bool:
        c = self.client.candidate()
        return c is not None and c.lineage.get("attempt_id") == self._state_id

    def stage_step(self, state: dict[str, Any]) -> dict[str, Any]:
        self._state_id = state["id"]
        if not self._ours():
            lineage = {
                "run": state["run_dir"],
                "data_window": f"{state['window']['episodes']} episodes, {state['window']['since_ns']}.."
                f"{state['window']['until_ns']}",
                "attempt_id": state["id"],
            }
            versions = {a: (state["candidate_dirs"][a], v) for a, v in state["candidate_versions"].items()}
            self.client.stage_candidate(versions, lineage, share=self.cfg.canary.share)
        state["canary_start_ns"] = time.time_ns()
        state["canary_deadline"] = time.time() + self.cfg.canary.timeout_s
        self.log("canary_started", state, share=self.cfg.canary.share)
        state["phase"] = "canary"
        return state

    def canary_step(self, state: dict[str, Any]) -> dict[str, Any]:
        self._state_id = state["id"]
        if not self._ours():  # the server restarted, or someone else decided: nothing of ours is staged
            state["phase"], state["decision"] = "deciding", "lost"
            return state
        candidate = state["candidate_versions"]
        incumbent = {a: v for a, (v, _) in state["incumbent"].items() if a in candidate}
        reward = None if self.cfg.canary_reward == "feedback" else self.reward
        while True:
            t = tally(self.episodes(state["canary_start_ns"]), self.role_of, candidate, incumbent, reward)
            verdict = decide(t, self.cfg.canary)
            state["canary"] = t.figures()
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
                self.client.abandon_candidate()
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
        """Drop whatever this loop's unfinished attempt staged; the incumbent keeps serving."""
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
