"""training/demo.py's choice of the kept stage, from a run's metrics: the most trained stage whose
validation return is within the noise of the best one (0 = the warm start), the adapter versions after
that many stages, the stages that lost return beyond the noise of two binomial estimates, and the veto
on the test tasks (no stage kept when the chosen one is worse than the warm start beyond noise)."""

from __future__ import annotations

from teamtr.graphs.run_layout import versions_after_stage
from teamtr.training.demo import stage_returns
from teamtr.training.metrics import MetricsLog
from teamtr.training.stage_safety import worse_beyond_noise


def write_run(path, returns: list[float], episodes: int = 100) -> None:
    log = MetricsLog(path, tensorboard=False)
    log.log("eval", 0, stage=0, accuracy=returns[0], episodes=episodes)  # stage 0: the start
    version = {"a": 0, "b": 0}
    step = 0
    for stage, (before, after) in enumerate(zip(returns, returns[1:], strict=False), start=1):
        for role in ("a", "b"):
            accepted = not (stage == 2 and role == "b")  # one rejected update keeps its version
            version[role] += accepted
            step += 1
            log.log("update", step, stage=stage, adapter=role, accepted=accepted, version_after=version[role])
        log.log("stage", step, stage=stage, eval_before=before, eval_after=after)
    log.close()


def test_the_best_stage_is_kept_with_its_versions(tmp_path):
    write_run(tmp_path, [0.30, 0.45, 0.50, 0.50, 0.30])
    stages = stage_returns(tmp_path)
    assert stages["returns"] == [0.30, 0.45, 0.50, 0.50, 0.30]
    assert stages["best"] == 2  # the first of the two best stages
    assert stages["kept"] == 3  # the later of the two; stage 4 is below the best beyond noise
    assert stages["se"][0] == (0.3 * 0.7 / 100) ** 0.5
    assert stages["losses_beyond_noise"] == [4]  # 0.50 -> 0.30 on 100 episodes each: beyond 2 SE
    assert stages["below_best_beyond_noise"] == [4]
    assert versions_after_stage(tmp_path, 0) == {"a": 0, "b": 0}  # the warm start
    assert versions_after_stage(tmp_path, 2) == {"a": 2, "b": 1}  # b's stage-2 update was rejected
    assert versions_after_stage(tmp_path, 4) == {"a": 4, "b": 3}


def test_a_run_that_only_falls_keeps_the_warm_start(tmp_path):
    write_run(tmp_path, [0.50, 0.48, 0.47])
    stages = stage_returns(tmp_path)
    assert stages["best"] == 0 and stages["losses_beyond_noise"] == []  # small drops are within noise
    assert stages["kept"] == 2  # the last stage: within the noise of the warm start's return


def test_a_noisy_validation_peak_does_not_decide_the_kept_stage(tmp_path):
    """The issue's run: the 128-episode validation return peaked after stage 1 (0.59), the other stages
    within 2 standard errors of it; the most trained of them is kept, not the peak."""
    write_run(tmp_path, [0.52, 0.59, 0.50, 0.55, 0.53, 0.57, 0.51, 0.56, 0.54], episodes=128)
    stages = stage_returns(tmp_path)
    assert stages["best"] == 1 and stages["kept"] == 8
    write_run(tmp_path / "falls", [0.52, 0.59, 0.50, 0.55, 0.53, 0.57, 0.51, 0.56, 0.40], episodes=128)
    assert stage_returns(tmp_path / "falls")["kept"] == 7  # 0.40 is below 0.59 beyond noise


def test_a_stage_worse_than_the_warm_start_beyond_noise_is_vetoed():
    before = {"accuracy": 0.45, "episodes": 300}
    assert not worse_beyond_noise(before, {"accuracy": 0.443, "episodes": 300})  # the 45.0 -> 44.3
    assert not worse_beyond_noise(before, {"accuracy": 0.50, "episodes": 300})
    # 2 SE of the difference at 45% on 300 episodes each: ~8.1 points
    assert not worse_beyond_noise(before, {"accuracy": 0.37, "episodes": 300})
    assert worse_beyond_noise(before, {"accuracy": 0.36, "episodes": 300})


def test_examples_demo_yaml_holds_the_demo_settings():
    """`teamtr demo --config examples/demo.yaml` trains what `teamtr demo` does (docs/training.md gives
    the measurements behind DEMO_CONFIG); only where the run goes and how its team is named differ."""
    from pathlib import Path

    from teamtr.training.config import TrainConfig
    from teamtr.training.demo import DEMO_CONFIG

    example = TrainConfig.from_yaml(Path(__file__).resolve().parents[2] / "examples" / "demo.yaml")
    demo = TrainConfig.from_dict(DEMO_CONFIG)
    same = {"run_dir": example.run_dir, "team.roles": "teamtr.graphs.chain_team:chain_roles"}
    assert example.model_dump() == demo.with_overrides(same).model_dump()


def test_a_slow_decline_is_flagged_against_the_best_earlier_stage(tmp_path):
    """Each stage loses 5 points on 100 episodes (within the noise of one step), but 15 points below the
    start is beyond the noise of that difference (2 SE ~ 13.8 points)."""
    write_run(tmp_path, [0.50, 0.45, 0.40, 0.35, 0.30])
    stages = stage_returns(tmp_path)
    assert stages["losses_beyond_noise"] == []
    assert stages["below_best_beyond_noise"] == [3, 4]
    assert stages["best"] == 0
