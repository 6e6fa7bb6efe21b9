"""Algorithm 1 on a real (tiny) LLM team: schedules resample exactly when they should, the trust region
holds, a rejected update leaves the adapter bit-identical, and a run killed with SIGKILL resumes to the
same adapters as an uninterrupted run.

The team and task (tests/support/trainer_task.py) are the chain team's three roles on a seconds-sized random
Llama, rewarded for a final message that starts with a digit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from teamtr.graphs.run_layout import read_metrics
from teamtr.training.config import TrainConfig
from tests.support.trainer import RUNNER, final_adapters, run_to_completion, small_config, stage_team, train
from tests.support.trainer_task import RUNNER_IMPORT

torch.set_num_threads(1)



def test_teamtr_resamples_after_every_update(tiny_model, tmp_path):
    updates = train(small_config(tiny_model, tmp_path / "run", **{"schedule.kind": "teamtr"}))
    assert [u["index"] for u in updates] == [1, 2, 3]
    for prev, cur in zip(updates, updates[1:], strict=False):
        # the batch of update i was sampled after update i-1 was swapped in: its episodes carry the new version
        assert cur["batch_turn_versions"][prev["adapter"]] == [prev["version_after"]]
        assert cur["fresh"] and cur["batch_key"] != prev["batch_key"]
    assert all(u["batch_turn_versions"] == {a: [v] for a, v in u["versions_before"].items()} for u in updates)


def test_stage_certificate_is_the_sum_of_its_update_terms(tiny_model, tmp_path):
    cfg = small_config(tiny_model, tmp_path / "run", stages=2)
    train(cfg)
    updates, stages = read_metrics(cfg.run_dir, "update"), read_metrics(cfg.run_dir, "stage")
    assert [s["stage"] for s in stages] == [1, 2]
    for s in stages:
        mine = [u["certificate"] for u in updates if u["stage"] == s["stage"]]
        terms = [c["value"] for c in mine]
        assert len(terms) == 3 and s["certificate_forms"]["proxy"] == sum(terms)
        # the headline certificate is the held-out form that applies: the chain roles speak once each
        assert s["certificate_forms"]["headline"] == s["certificate_forms"]["form"] == "speak_once"
        assert s["certificate"] == s["certificate_forms"]["heldout"] == sum(c["speak_once"] for c in mine)
        assert s["realised_improvement"] == s["eval_after"] - s["eval_before"]
    for u in updates:  # each term is L_hat - c sqrt(max(d_hat, 0)) - zeta_hat / (1 - gamma) of its update
        c = u["certificate"]
        assert c["d_hat"] == u["d_hat"]
        expected = c["surrogate"] - c["c"] * max(c["d_hat"], 0.0) ** 0.5 - c["zeta"] / (1 - c["gamma"])
        assert c["value"] == pytest.approx(expected, abs=1e-12)


def test_naive_reuses_the_stage_start_batch(tiny_model, tmp_path):
    updates = train(
        small_config(
            tiny_model, tmp_path / "run", **{"schedule.kind": "naive", "schedule.diagnose_stale_gap": True}
        )
    )
    start = updates[0]["batch_turn_versions"]
    assert all(u["batch_turn_versions"] == start for u in updates)
    assert {u["batch_key"] for u in updates} == {"s0-k0"}
    assert not any(u["fresh"] for u in updates[1:])
    # the diagnostic fresh batches measure the stale gap and occupancy divergence for i >= 2
    assert all(u["stale_gap"] is not None and u["occupancy_divergence"] is not None for u in updates[1:])


def test_importance_weighting_logs_ess(tiny_model, tmp_path):
    updates = train(small_config(tiny_model, tmp_path / "run", **{"schedule.kind": "importance_weighting"}))
    assert updates[0]["ess"] is None
    assert all(0.0 < u["ess"] <= 1.0 + 1e-9 for u in updates[1:])


def test_every_accepted_update_is_inside_the_trust_region(tiny_model, tmp_path):
    cfg = small_config(
        tiny_model,
        tmp_path / "run",
        stages=2,
        **{
            "optim.lr": 5e-2,
            "trust_region.delta": 0.02,
            "trust_region.estimator": "k3",
            "trust_region.max_backtracks": 2,
        },
    )
    updates = train(cfg)
    assert any(u["backtracks"] > 0 or not u["accepted"] for u in updates), "no update ever left the region"
    for u in updates:
        if u["accepted"]:
            assert u["d_hat"] <= cfg.trust_region.delta
        else:
            assert u["version_after"] == u["versions_before"][u["adapter"]]


@pytest.mark.parametrize("check", ["probe", "sampled"])
def test_a_rejected_update_leaves_the_adapter_bit_identical(tiny_model, tmp_path, check):
    from teamtr.training.stage import UpdateContext

    cfg = small_config(
        tiny_model, tmp_path / "run", **{"optim.lr": 0.5, "trust_region.delta": 1e-9, "trust_region.max_backtracks": 1,
                                         "trust_region.estimator": "k3", "trust_region.check": check}
    )  # fmt: skip
    team = stage_team(cfg, tiny_model)
    engine = team.engine
    batch = team.rollout(0, 0)
    # give the optimizer state first, so that restoring it is part of what is checked
    first = team.update(UpdateContext(0, 1, "adder1", batch, batch, fresh=True, reweight=False))
    before = {k: p.detach().clone() for k, p in engine.adapter_parameters("adder1").items()}
    opt_before = {id_: {k: v.clone() for k, v in s.items() if torch.is_tensor(v)}
                  for id_, s in team.policies["adder1"].optimizer.state_dict()["state"].items()}  # fmt: skip
    version = engine.adapter_version("adder1")
    rejected = team.update(UpdateContext(0, 1, "adder1", batch, batch, fresh=True, reweight=False))
    # sampled: the attempt and its one backtrack; probe: one attempt whose every line-search point was outside
    attempts = 2 if check == "sampled" else 1
    assert not rejected.accepted and len(rejected.record["attempts"]) == attempts and first is not rejected
    # a rejected update did not move the policy: no surrogate improvement, no KL, no version bump
    assert rejected.certificate.surrogate == 0.0 and rejected.record["d_hat"] == 0.0
    assert rejected.record["version_after"] == version
    assert engine.adapter_version("adder1") == version
    for k, p in engine.adapter_parameters("adder1").items():
        assert torch.equal(p.detach(), before[k]), k
    opt_after = team.policies["adder1"].optimizer.state_dict()["state"]
    for id_, s in opt_before.items():
        for k, v in s.items():
            assert torch.equal(opt_after[id_][k], v)


def _kill_then_resume(script: Path, config: Path, ready: Callable[[str], bool]) -> None:
    """Run `script config`, SIGKILL it as soon as ready(its metrics.jsonl text) holds, then rerun it to the
    end (the run resumes from its last checkpoint)."""
    metrics = Path(TrainConfig.from_yaml(config).run_dir) / "metrics.jsonl"
    proc = subprocess.Popen([sys.executable, str(script), str(config)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and ready(metrics.read_text()):
            break
        time.sleep(0.02)
    killed_mid_run = proc.poll() is None
    if killed_mid_run:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert killed_mid_run, "the run finished before it could be killed"
    run_to_completion(script, config)


def _assert_same_adapters(reference: Path, resumed: Path) -> None:
    ref, res = final_adapters(reference), final_adapters(resumed)
    assert ref.keys() == res.keys()
    for name in ref:
        for k in ref[name]:
            assert torch.equal(ref[name][k], res[name][k]), f"{name} {k}"


def test_kill_9_then_resume_gives_bit_identical_adapters(tiny_model, tmp_path):
    script = tmp_path / "runner.py"
    script.write_text(RUNNER.format(fixtures=RUNNER_IMPORT))
    env_free = {"stages": 2}
    ref_cfg = small_config(tiny_model, tmp_path / "reference", **env_free)
    cut_cfg = small_config(tiny_model, tmp_path / "interrupted", **env_free)
    cut_cfg.to_yaml(tmp_path / "interrupted.yaml")
    train(ref_cfg)  # uninterrupted, in this process

    # run, SIGKILL it once it has completed two updates (mid-stage 0 or later), rerun the same command
    _kill_then_resume(script, tmp_path / "interrupted.yaml", lambda log: log.count('"kind": "update"') >= 2)
    _assert_same_adapters(tmp_path / "reference", tmp_path / "interrupted")
    assert [r["d_hat"] for r in read_metrics(tmp_path / "reference", "update")] == [
        r["d_hat"] for r in read_metrics(tmp_path / "interrupted", "update")
    ]


# the same run with stages 2 and 3 judged worse than the best earlier stage beyond noise, so eval.keep_best
# undoes them (the decision forced: the tiny model's held-out return does not move; what is tested is the
# resume: stage 3's revert needs the best stage's weights from the checkpoint)
RUNNER_REVERT = RUNNER.replace(
    "Trainer(TrainConfig", """
from unittest import mock
from teamtr.training.stage_safety import BestStage
keep_best = Trainer._keep_best

def undo_stages_2_and_3(self, team, stage, result):
    if stage not in (1, 2):
        return keep_best(self, team, stage, result)
    with mock.patch.object(BestStage, "should_revert", lambda best, result: True):
        return keep_best(self, team, stage, result)

Trainer._keep_best = undo_stages_2_and_3
Trainer(TrainConfig""",
)


def test_kill_9_after_a_revert_then_resume_gives_bit_identical_adapters(tiny_model, tmp_path):
    script = tmp_path / "runner.py"
    script.write_text(RUNNER_REVERT.format(fixtures=RUNNER_IMPORT))
    for name in ("reference", "interrupted"):
        small_config(tiny_model, tmp_path / name, stages=3).to_yaml(tmp_path / f"{name}.yaml")
    run_to_completion(script, tmp_path / "reference.yaml")

    # SIGKILL the run as soon as stage 2's revert is logged (before or after its checkpoint), then resume
    _kill_then_resume(script, tmp_path / "interrupted.yaml", lambda log: '"kind": "revert"' in log)
    _assert_same_adapters(tmp_path / "reference", tmp_path / "interrupted")
    # every record but wall times and the instruments that read the engine's sampling-time log-probs (their
    # last bits depend on which sequences the engine happened to batch together, in any run)
    timing = ("seconds", "logprob_gap", "logprob_gap_max", "occupancy_divergence")
    for kind in ("update", "revert", "stage"):
        records = [
            [{k: v for k, v in r.items() if k not in timing} for r in read_metrics(tmp_path / run, kind)]
            for run in ("reference", "interrupted")
        ]
        assert records[0] and records[0] == records[1], kind
    # every role was reverted at stage 2 and again at stage 3, in the resumed process
    assert sorted(r["stage"] for r in read_metrics(tmp_path / "interrupted", "revert")) == [2, 2, 2, 3, 3, 3]


def test_cli_train_prints_one_line_per_update_and_report_writes_pngs(tiny_model, tmp_path):
    from typer.testing import CliRunner

    from teamtr.cli.main import app

    cfg = small_config(tiny_model, tmp_path / "run")
    cfg.to_yaml(tmp_path / "c.yaml")
    runner = CliRunner()
    result = runner.invoke(
        app, ["train", str(tmp_path / "c.yaml"), "--set", "schedule.diagnose_stale_gap=true"]
    )
    assert result.exit_code == 0, result.output
    assert result.output.count("d_hat") >= 3 and "adder3" in result.output
    result = runner.invoke(app, ["report", str(tmp_path / "run"), "--out", str(tmp_path / "plots")])
    assert result.exit_code == 0, result.output
    pngs = sorted(p.name for p in (tmp_path / "plots").glob("*.png"))
    assert pngs == [
        "certificate_vs_improvement.png",
        "kl_per_update.png",
        "return_per_stage.png",
        "stale_gap.png",
    ]
    assert all((tmp_path / "plots" / p).stat().st_size > 1000 for p in pngs)
    bad = runner.invoke(app, ["train", str(tmp_path / "missing.yaml")])
    assert bad.exit_code != 0


def test_demo_writes_summary_and_compare_json(tiny_model, tmp_path):
    from teamtr.training.demo import run_compare, run_demo

    cfg = small_config(
        tiny_model, tmp_path / "unused", **{"eval.final_episodes": 6, "eval.stage_episodes": 0}
    )
    cfg.to_yaml(tmp_path / "demo.yaml")
    summary = run_demo(tmp_path / "demo", base_config=tmp_path / "demo.yaml")
    on_disk = __import__("json").loads((tmp_path / "demo" / "summary.json").read_text())
    assert on_disk == summary
    for key in ("accuracy_before", "accuracy_after", "episodes_evaluated", "seconds"):
        assert key in summary
    assert summary["episodes_evaluated"] == 6
    assert all(Path(p).exists() for p in summary["plots"])
    # no stage evaluations: nothing to choose a stage by, the last stage's adapters are evaluated
    assert summary["kept_stage"] == summary["stages"]
    assert summary["accuracy_last_stage"] == summary["accuracy_after"]
    assert summary["stages_losing_beyond_noise"] == summary["stages_below_best_beyond_noise"] == []
    # the weights the figures start from, by digest (a model of the test's own: not the shipped one)
    from teamtr.training.warmstart.shipped import weights_digest

    assert summary["weights_sha256"] == weights_digest(tiny_model) and summary["weights_shipped"] is False
    assert "test_accuracy.png" in {Path(p).name for p in summary["plots"]}

    result = run_compare(tmp_path / "cmp", seeds=2, base_config=tmp_path / "demo.yaml")
    assert [r["seed"] for r in result["per_seed"]] == [0, 1]
    for row in result["per_seed"]:
        # naive gets TeamTR's rollout-token budget (it stops at the first stage boundary past it)
        assert row["naive_rollout_tokens"] >= row["teamtr_rollout_tokens"]
        assert row["naive_stages"] >= row["teamtr_stages"]
    assert set(result) >= {"warm_start", "teamtr", "naive", "rollout_tokens"}
    assert (tmp_path / "cmp" / "compare.json").exists()
