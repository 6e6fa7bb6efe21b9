"""A training run directory, read one way by every command (train, eval, swap, demo, report, improve).

The layout and the team a run names are graphs/run_layout.py's (`RunFiles`, which serving reads with
nothing of training); `RunDir` adds what training owns: the whole TrainConfig, the task family, the
warm-started base model (built once, then recorded in the run as base_models.json) and the engines.

    run = RunDir("runs/demo/run")          # FileNotFoundError / RunDirError if it is not a readable run
    run.roles, run.task(), run.model_path(), run.saved_adapters()
    engine = run.engine()                  # every role's newest adapter loaded on its own base model
    team = run.team(run.roles, engine, temperature=0.0, name="eval")   # taking turns by team.router
"""

from __future__ import annotations

import json
import shutil
import warnings
from difflib import get_close_matches
from pathlib import Path
from typing import Any, Literal

from teamtr.engines.embedded import EmbeddedEngine, LoraSettings
from teamtr.engines.models import ModelReferenceError, check_reference
from teamtr.engines.open import EngineSpec, EngineSpecError, open_engine
from teamtr.engines.vllm_server import VLLMServerError
from teamtr.graphs.capture import describe_error
from teamtr.graphs.code_digest import record_code_digest
from teamtr.graphs.engine import DEFAULT_BASE
from teamtr.graphs.loading import ConfigObjectError, load_object
from teamtr.graphs.roles import Role
from teamtr.graphs.run_layout import (
    BASES_FILE,
    CONFIG_FILE,
    METRICS_FILE,
    RunDirError,
    RunFiles,
    read_metrics,
)
from teamtr.graphs.spec import SpecError, TaskConfig, TeamConfig, default_model, team_options, team_roles
from teamtr.graphs.task import TaskFamily
from teamtr.graphs.user_graph import UserGraphError, data_family
from teamtr.training.config import TrainConfig
from teamtr.training.config_file import read_config
from teamtr.training.vllm_rollouts import VLLMRollouts

__all__ = ["CONFIG_FILE", "RunDir", "RunDirError", "lora_settings", "model_path", "read_config"]


def lora_settings(cfg: TrainConfig) -> LoraSettings:
    lora = LoraSettings(r=cfg.team.lora_rank, alpha=cfg.team.lora_alpha)
    if cfg.team.lora_targets:
        lora.target_modules = tuple(cfg.team.lora_targets)
    return lora


def model_path(cfg: TrainConfig, progress: bool = False) -> str:
    """The default base model: `team.model` (for a user's graph, SmolLM2 by default: graphs/spec.py
    `default_model`), else the task's cached warm-started model built with `team.warm_start`'s overrides
    (built once)."""
    reference = default_model(cfg.team)
    if reference:
        return reference
    from teamtr.training.warmstart import ensure_warm_model, warm_config_for

    return str(ensure_warm_model(warm_config_for(cfg.task.name, **cfg.team.warm_start), progress=progress))


def with_default_model(cfg: TrainConfig) -> TrainConfig:
    """`cfg` with the default base it gets written in as `team.model` (a user's graph: smollm2), so that
    the run's config.yaml names the model it trains on; unchanged when it names one or uses a warm model."""
    reference = default_model(cfg.team)
    return cfg if cfg.team.model or reference is None else cfg.with_overrides({"team.model": reference})


def check_task(cfg: TrainConfig) -> None:
    """A task family this teamtr knows (its roles' module imported first: it may register the run's own)."""
    from teamtr.tasks import task_names

    if cfg.task.data is None and cfg.task.name not in task_names():
        close = get_close_matches(cfg.task.name, task_names(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise SpecError(f"task.name: unknown task {cfg.task.name!r}{hint}; known: {', '.join(task_names())}")


def check_config(cfg: TrainConfig, source: str | Path) -> None:
    """Everything about `cfg` that can be checked before a run exists, as one line naming `source` (the
    user's file): the roles, the task (with the name it was probably meant as), the router, the graph
    factory and the task data. `RunDir.create` calls it before it writes anything."""
    try:
        team_roles(cfg.team, cfg.task, _default_roles)
        check_task(cfg)
        team_options(cfg.team)
        if cfg.team.graph is not None:
            load_object(cfg.team.graph, "team.graph")
        if cfg.task.data is not None:
            data_family(cfg.task.data, cfg.task.name)
        if cfg.task.eval_data is not None:
            data_family(cfg.task.eval_data, cfg.task.name, key="task.eval_data")
        if (reference := default_model(cfg.team)) is not None:
            check_reference(reference)  # a missing folder, or smollm2 without its package
    except (SpecError, ConfigObjectError, ModelReferenceError) as e:
        raise RunDirError(f"{source}: {e}") from None


PREVIOUS_DIR = "previous"  # RUN_DIR/previous/N/: the files of a run started over (RunDir.create)


class RunRestartedWarning(UserWarning):
    """A run directory's earlier run was moved aside and the run starts over."""


def trained_update_count(path: Path) -> int:
    """Updates the run in `path` trained (accepted; not rejected, not skipped for lack of signal)."""
    if not (path / METRICS_FILE).is_file():
        return 0
    updates = read_metrics(path, kind="update")
    return sum(bool(u.get("accepted")) and not u.get("no_signal") for u in updates)


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_differences(old: dict[str, Any], new: dict[str, Any], most: int = 6) -> str:
    """`key: old -> new` for the keys two configs differ in (at most `most`, then how many more)."""
    a, b = _flat(old), _flat(new)
    keys = [k for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)]
    shown = [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in keys[:most]]
    more = f" and {len(keys) - most} more" if len(keys) > most else ""
    return "differs in " + "; ".join(shown) + more


def set_aside(path: Path) -> Path:
    """Move everything in run directory `path` (but earlier set-asides) to path/previous/N/; that folder."""
    root = path / PREVIOUS_DIR
    n = 1 + max((int(p.name) for p in root.glob("*") if p.name.isdigit()), default=0)
    target = root / str(n)
    target.mkdir(parents=True)
    for entry in path.iterdir():
        if entry.name != PREVIOUS_DIR:
            shutil.move(str(entry), target / entry.name)
    return target


def record_failure(path: Path, error: BaseException) -> None:
    """A `failed` record in the run's metrics.jsonl saying why the run stopped, unless its last record is
    already one (a failed rollout batch writes its own, naming the stage and rollout)."""
    metrics = path / METRICS_FILE
    records = read_metrics(path) if metrics.is_file() else []
    if records and records[-1].get("kind") == "failed":
        return
    step = records[-1].get("step", 0) if records else 0
    with open(metrics, "a") as f:
        f.write(
            json.dumps({"kind": "failed", "step": step, "where": "run", "error": describe_error(error)})
            + "\n"
        )


def _default_roles(task: str, **kwargs: Any) -> list[Role]:
    from teamtr.tasks.roles import default_roles

    return default_roles(task, **kwargs)


class RunDir(RunFiles):
    """An existing run directory: its config, roles, task, base models, adapter versions and engine."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path, _default_roles)
        from teamtr.tasks import task_names

        if self.config.team.roles and self.config.task.name not in task_names():
            _ = self.roles  # importing the roles' module may register the run's own task family
        try:
            check_task(self.config)
        except SpecError as e:
            raise RunDirError(f"{self.path / CONFIG_FILE}: {e}") from None
        _ = self.team_options  # a router that cannot be imported fails when the run is opened

    def _read_sections(self) -> tuple[TeamConfig, TaskConfig]:
        self.config = read_config(self.path / CONFIG_FILE)
        return self.config.team, self.config.task

    @classmethod
    def create(cls, cfg: TrainConfig, restart: bool = False) -> RunDir:
        """The run directory of `cfg` (cfg.run_dir): made and given cfg's config.yaml (with the default base
        it gets named: `with_default_model`), or, when it holds a run already, checked to hold this same
        config (a resume; a run written before a graph's default was named keeps its `model: null`).

        A run there with another config is started over with `cfg` when it trained no update (a failed
        start, fixed), or when `restart` (`teamtr train --restart`): its files move to RUN_DIR/previous/N/
        (a RunRestartedWarning says so). A run that trained is refused otherwise, naming the keys that
        differ. The modules the config names are digested into code_digest.json (graphs/code_digest.py)."""
        path = Path(cfg.run_dir)
        saved = path / CONFIG_FILE
        given, cfg = cfg, with_default_model(cfg)
        if saved.exists():
            old = read_config(saved).to_dict()
            differs = old not in (cfg.to_dict(), given.to_dict())
            trained = trained_update_count(path)
            if differs and trained and not restart:
                raise RunDirError(
                    f"{path} holds a run with a different config ({saved}: {config_differences(old, cfg.to_dict())}) "
                    f"that trained {trained} update(s): resume it with that config, choose another run_dir "
                    f"(--run-dir), or start it over with `teamtr train CONFIG --restart` (its files move to "
                    f"{path / PREVIOUS_DIR}/N/)"
                )
            if differs or restart:
                check_config(cfg, saved)  # the new config can run before the old run is moved aside
                moved = set_aside(path)
                why = (
                    "--restart"
                    if restart and not differs
                    else f"config changed: {config_differences(old, cfg.to_dict())}"
                )
                warnings.warn(
                    RunRestartedWarning(
                        f"{path}: started over ({why}; it had trained {trained} update(s)); its files are in {moved}"
                    ),
                    stacklevel=2,
                )
        else:
            check_config(cfg, saved)  # a config that cannot run leaves no run directory behind
        path.mkdir(parents=True, exist_ok=True)
        if not saved.exists():
            cfg.to_yaml(saved)
        record_code_digest(path, cfg.team)
        return cls(path)

    def task(self) -> TaskFamily:
        from teamtr.tasks import get_task

        if self.config.task.data is not None:  # a user graph's own tasks (graphs/user_graph.py)
            try:
                return data_family(self.config.task.data, self.config.task.name)
            except UserGraphError as e:
                raise RunDirError(f"{self.path / CONFIG_FILE}: {e}") from None
        return get_task(self.config.task.name, **self.config.task.options)

    def eval_task(self) -> TaskFamily:
        """The tasks the run's held-out evaluations draw from: `task.eval_data` (each task at most once),
        else the task family itself (with `task.data`: the training list, drawn with task.eval_seed)."""
        if self.config.task.eval_data is None:
            return self.task()
        try:
            return data_family(
                self.config.task.eval_data, self.config.task.name, key="task.eval_data", whole=True
            )
        except UserGraphError as e:
            raise RunDirError(f"{self.path / CONFIG_FILE}: {e}") from None

    def lora(self) -> LoraSettings:
        return lora_settings(self.config)

    def model_path(self, progress: bool = False) -> str:
        """`team.model`, else the base the run recorded (what it trained on, while that folder exists),
        else the warm-started model, built."""
        recorded = self.recorded_bases().get(DEFAULT_BASE)
        if not self.config.team.model and recorded and Path(recorded).is_dir():
            return recorded
        return model_path(self.config, progress)

    def default_model(self) -> str:
        """The default base (building the warm model if the config names none), recorded in the run so
        that serving finds it without training (graphs/run_layout.py)."""
        path = self.model_path()
        recorded = self.recorded_bases()
        if recorded.get(DEFAULT_BASE) != str(Path(path).resolve()) and not self.config.team.model:
            recorded[DEFAULT_BASE] = str(Path(path).resolve())
            (self.path / BASES_FILE).write_text(json.dumps(recorded, indent=2) + "\n")
        return path

    # ---- the engines -------------------------------------------------------------------------------
    def engine_spec(self, bases: dict[str, str], *, threads: int | None = None, **fields: Any) -> EngineSpec:
        """The run's engine settings (device, dtype, threads, LoRA) on `bases`; `fields` override them."""
        settings: dict[str, Any] = {
            "bases": bases,
            "device": self.config.team.device,
            "dtype": self.config.team.dtype,
            "threads": self.config.torch_threads if threads is None else threads,
            "lora": self.lora(),
            "lora_rank": self.config.team.lora_rank,
            "adapters": len({r.adapter for r in self.roles if r.adapter is not None}),
        }
        return EngineSpec(**{**settings, **fields})

    def engine(
        self,
        adapters: Literal["latest", "fresh"] = "latest",
        *,
        version: int | dict[str, int] | None = None,
        roles: list[Role] | None = None,
        extra_bases: dict[str, str] | None = None,
        threads: int | None = None,
    ) -> EmbeddedEngine:
        """An embedded engine with each role's adapter on its own base: the saved `latest` (or `version`)
        adapters, or `fresh` LoRA adapters made with the run's LoRA settings (seed torch first for a
        reproducible initialisation). `extra_bases` are loaded beside the run's (a swap's newcomer)."""
        roles = self.roles if roles is None else roles
        saved = self.saved_adapters(version, roles) if adapters == "latest" else {}
        spec = self.engine_spec({**self.base_paths(roles), **(extra_bases or {})}, threads=threads)
        engine = open_engine(spec).engine
        assert isinstance(engine, EmbeddedEngine)
        for r in roles:
            if r.adapter is None or r.adapter in engine.adapters(r.base_model):
                continue
            if adapters == "fresh":
                engine.add_adapter(r.adapter, base=r.base_model)
            else:
                version, path = saved[r.adapter]
                engine.load_adapter_sync(r.adapter, path, base=r.base_model)
                while engine.adapter_version(r.adapter, r.base_model) < version:  # episodes record vN
                    engine.commit_adapter_update(r.adapter, r.base_model)
        return engine

    def rollout_engine(
        self, trainer_engine: EmbeddedEngine, roles: list[Role] | None = None
    ) -> EmbeddedEngine | VLLMRollouts:
        """The engine the training team samples its rollouts through (`rollout.engine`): the trainer's
        own (`embedded`), or vLLM (`vllm`: the server at `rollout.vllm_url`, else one launched per base in
        the trainer's dtype; `close()` stops it), whose adapters the trainer pushes (training/llm_team.py)."""
        rollout = self.config.rollout
        if rollout.engine == "embedded":
            return trainer_engine
        roles = self.roles if roles is None else roles
        spec = self.engine_spec(
            self.base_paths(roles),
            kind="vllm",
            dtype=str(trainer_engine.dtype).removeprefix("torch."),
            adapters=len({r.adapter for r in roles if r.adapter is not None}),
            vllm=rollout.vllm_spec("rollout.vllm_url"),
        )
        try:
            opened = open_engine(spec)
        except (EngineSpecError, VLLMServerError) as e:  # a bad URL, a server that would not start
            raise RunDirError(f"{self.path / CONFIG_FILE}: rollout.engine vllm: {e}") from None
        return VLLMRollouts(opened.engine, servers=opened.servers)  # type: ignore[arg-type]
