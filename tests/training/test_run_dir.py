"""training/run_dir.py `RunDir`, the one reader of run directories: a team whose role and adapter names
differ is trained, served, evaluated and pushed under one naming; versions, LoRA settings and config
errors as the commands see them."""

from __future__ import annotations

import json

import openai
import pytest
import torch
import yaml
from typer.testing import CliRunner

from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.roles import Role
from teamtr.training.config import TrainConfig
from teamtr.training.run_dir import RunDir, RunDirError, read_config
from tests.support import trainer_task

torch.set_num_threads(1)

SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=4, stop=("\n",))


def renamed_roles() -> list[Role]:
    """The chain team with role names unlike their adapters' names."""
    return [
        Role(name, "Add the first two numbers.", adapter=f"lora-{name}", sampling=SAMPLING)
        for name in ("first", "second", "third")
    ]


def tiny_config(model, run_dir, task: str = "chain", **team) -> TrainConfig:
    return TrainConfig.from_dict(
        {
            "run_dir": str(run_dir),
            "stages": 1,
            "task": {"name": task},
            "team": {"model": str(model), "lora_rank": 4, **team},
            "rollout": {"prompts_per_update": 2, "group_size": 2},
            "optim": {"lr": 5e-3, "epochs": 1, "minibatch_messages": 8},
            "eval": {"stage_episodes": 2, "final_episodes": 2},
        }
    )


@pytest.fixture(scope="module")
def renamed_run(tiny_model_dir, tmp_path_factory):
    from teamtr.training.trainer import Trainer

    # a reward a random model earns half the time: the stage's updates move (an all-zero-advantage
    # update makes no version, and the tests below need stage 1 to differ from stage 0)
    cfg = tiny_config(
        tiny_model_dir,
        tmp_path_factory.mktemp("renamed") / "run",
        task=trainer_task.ODD_TASK,
        roles=f"{__name__}:renamed_roles",
    )
    Trainer(cfg).train()
    return RunDir(cfg.run_dir)


def test_adapters_are_saved_and_read_under_the_adapters_name(renamed_run):
    assert sorted(p.name for p in (renamed_run.path / "adapters").iterdir()) == [
        "lora-first",
        "lora-second",
        "lora-third",
    ]
    latest = renamed_run.saved_adapters()
    assert set(latest) == {"lora-first", "lora-second", "lora-third"}
    assert all(path == renamed_run.adapter_dir(a, v) for a, (v, path) in latest.items())
    assert renamed_run.saved_adapters(versions=0)["lora-second"][0] == 0  # a named version
    with pytest.raises(RunDirError, match="has no version 99"):
        renamed_run.saved_adapters(versions=99)
    assert renamed_run.role("second").adapter == "lora-second" == renamed_run.role("lora-second").adapter
    engine = renamed_run.engine()
    assert sorted(engine.adapters()) == ["lora-first", "lora-second", "lora-third"]
    # the engine's versions are the saved ones: episodes of `teamtr eval` record which version spoke
    assert {a: engine.adapter_version(a) for a in latest} == {a: v for a, (v, _) in latest.items()}


def test_a_renamed_team_is_served_evaluated_and_pushed(renamed_run, tmp_path):
    from teamtr.cli.serve import app as cli_app
    from teamtr.evals.teams import load_eval_team
    from teamtr.serving.server import ServeConfig
    from tests.support.serving import serve_in_background

    team = load_eval_team(str(renamed_run.path), "chain")
    assert [r.name for r in team.roles] == ["first", "second", "third"]
    newest = {a: v for a, (v, _) in renamed_run.saved_adapters().items()}
    config = ServeConfig.from_run_dir(
        renamed_run.path, "chain", admin_key="adm", tracing={"sqlite_path": None}
    )
    with serve_in_background(config) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        reply = client.chat.completions.create(model="chain", messages=[{"role": "user", "content": "1+2+3"}])
        extension = reply.model_extra["teamtr"]
        assert [t["role"] for t in extension["turns"]] == ["first", "second", "third"]
        assert [t["adapter"] for t in extension["turns"]] == ["lora-first", "lora-second", "lora-third"]
        assert extension["adapter_versions"] == {r: newest[f"lora-{r}"] for r in ("first", "second", "third")}
        # `adapters push RUN_DIR --role ROLE`: the role's adapter is found by its role name
        import shutil

        source = renamed_run.adapter_dir("lora-second", newest["lora-second"])
        shutil.copytree(source, renamed_run.adapter_dir("lora-second", newest["lora-second"] + 1))
        env = {"TEAMTR_URL": server.url, "TEAMTR_ADMIN_KEY": "adm"}
        result = CliRunner().invoke(
            cli_app, ["adapters", "push", str(renamed_run.path), "--role", "second"], env=env
        )
        assert result.exit_code == 0, result.output
        assert server.server.registry.current_versions()["lora-second"] == newest["lora-second"] + 1
        shutil.rmtree(renamed_run.adapter_dir("lora-second", newest["lora-second"] + 1))


def test_a_run_is_served_and_evaluated_at_an_earlier_stage(renamed_run):
    """`teamtr serve/eval RUN --stage K`: the adapters after K stages (the demo keeps its best stage, not
    the last); a stage the run never reached is refused with the run's range."""
    from teamtr.evals.teams import load_eval_team
    from teamtr.graphs.run_layout import versions_after_stage
    from teamtr.serving.server import ServeConfig
    from tests.support.serving import serve_in_background

    newest = {a: v for a, (v, _) in renamed_run.saved_adapters().items()}
    assert any(v > 0 for v in newest.values())  # the stage moved something, so stage 0 differs
    assert versions_after_stage(renamed_run.path, 1) == newest
    start = versions_after_stage(renamed_run.path, 0)
    assert start == {a: 0 for a in newest}
    assert renamed_run.stage_versions(0) == start and renamed_run.stage_versions(None) is None  # None: newest
    team = load_eval_team(str(renamed_run.path), "chain", stage=0)
    assert team.adapters == {a: renamed_run.adapter_dir(a, 0) for a in newest}
    assert {a: team.engine.adapter_version(a) for a in newest} == start
    with pytest.raises(RunDirError, match="stage 2 is not one of this run's 0..1"):
        load_eval_team(str(renamed_run.path), "chain", stage=2)
    with pytest.raises(RunDirError, match="stage 2"):
        ServeConfig.from_run_dir(renamed_run.path, "chain", stage=2)
    config = ServeConfig.from_run_dir(renamed_run.path, "chain", stage=0, tracing={"sqlite_path": None})
    with serve_in_background(config) as server:
        assert server.server.registry.current_versions() == start
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        reply = client.chat.completions.create(model="chain", messages=[{"role": "user", "content": "1+2+3"}])
        assert reply.model_extra["teamtr"]["adapter_versions"] == {"first": 0, "second": 0, "third": 0}


def test_the_engine_uses_the_runs_lora_settings(tiny_model_dir, tmp_path):
    cfg = tiny_config(tiny_model_dir, tmp_path / "run", lora_targets=["q_proj"], lora_rank=2)
    run = RunDir.create(cfg)
    engine = run.engine("fresh")
    params = engine.adapter_parameters("adder1")
    assert params and all("q_proj" in name for name in params)
    assert all(p.shape[0] == 2 for name, p in params.items() if "lora_A" in name)
    with pytest.raises(RunDirError, match="no saved adapters"):
        run.engine()  # nothing trained yet


def test_a_run_refuses_a_different_config_and_names_bad_fields(tiny_model_dir, tmp_path):
    cfg = tiny_config(tiny_model_dir, tmp_path / "run")
    RunDir.create(cfg)
    # a run that trained an update (an untrained one starts over: tests/project/test_first_hour_traps.py)
    (tmp_path / "run" / "metrics.jsonl").write_text(json.dumps({"kind": "update", "accepted": True}) + "\n")
    with pytest.raises(RunDirError, match=r"different config .*seed: 0 -> 7.* --restart"):
        RunDir.create(cfg.with_overrides({"seed": 7}))
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump({"rollout": {"max_new_tokens": 16, "beam_width": 2}}))
    with pytest.raises(RunDirError, match=r"old\.yaml: rollout\.beam_width: .*another version"):
        read_config(path)
    path.write_text(yaml.safe_dump({"stages": 0}))
    with pytest.raises(RunDirError, match=r"old\.yaml: stages: Input should be greater than or equal to 1"):
        read_config(path)
    path.write_text(yaml.safe_dump({"task": {"name": "no-such-task"}}))
    (tmp_path / "bad").mkdir()
    path.rename(tmp_path / "bad" / "config.yaml")
    with pytest.raises(RunDirError, match="task.name: unknown task 'no-such-task'"):
        RunDir(tmp_path / "bad")
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        RunDir(tmp_path)


ROLES_MODULE = """
from teamtr.tasks import register, task_names
from teamtr.graphs.chain_team import chain_roles


class OwnTask:
    name = "run-dir-own-task"
    description = "a task family registered by the module of the team's roles"

    def generate(self, n, seed, **knobs):
        return []

    def extract_answer(self, response):
        return response

    def verify(self, instance, response):
        return 0.0


if OwnTask.name not in task_names():
    register(OwnTask)


def roles():
    return chain_roles(2)
"""


def test_a_task_registered_by_the_roles_module_is_known(tiny_model_dir, tmp_path, monkeypatch):
    (tmp_path / "own_team_module.py").write_text(ROLES_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    run = tmp_path / "run"
    run.mkdir()
    cfg = tiny_config(tiny_model_dir, run, roles="own_team_module:roles")
    (run / "config.yaml").write_text(
        yaml.safe_dump(cfg.with_overrides({"task.name": "run-dir-own-task"}).to_dict())
    )
    assert [r.name for r in RunDir(run).roles] == ["adder1", "adder2"]


def test_a_config_that_cannot_run_writes_nothing_and_says_what_was_meant(tiny_model_dir, tmp_path):
    """A misspelt key or task is refused before the run directory exists, naming the user's file and the
    name it was probably meant as; after the fix the same run_dir trains (no 'different config')."""
    from teamtr.cli.main import app

    config = tmp_path / "mine.yaml"
    good = tiny_config(tiny_model_dir, tmp_path / "run").to_dict()
    config.write_text(yaml.safe_dump({**good, "stagse": 2}))
    with pytest.raises(RunDirError, match=r"mine\.yaml: stagse: .*did you mean 'stages'"):
        read_config(config)
    config.write_text(yaml.safe_dump({**good, "task": {**good["task"], "name": "chian"}}))
    result = CliRunner().invoke(app, ["train", str(config)])
    assert result.exit_code != 0 and "did you mean 'chain'" in result.output
    assert "mine.yaml" in result.output
    assert not (tmp_path / "run").exists()
    config.write_text(yaml.safe_dump(good))
    result = CliRunner().invoke(app, ["train", str(config)])
    assert result.exit_code == 0, result.output
