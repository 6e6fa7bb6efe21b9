"""The files of a run directory, and reading a run as a team (the one owner of the layout):

    RUN_DIR/config.yaml                    the run's config (training/config.py TrainConfig; its `team` and
                                           `task` sections are graphs/spec.py's TeamConfig / TaskConfig)
    RUN_DIR/base_models.json               base name -> model directory the run trained on (written by
                                           training, so serving needs no warm-start build to find them)
    RUN_DIR/adapters/<adapter>/v<N>/       peft LoRA adapter of a role, one per accepted update (v0: start)
    RUN_DIR/metrics.jsonl, tensorboard/    training/metrics.py (update and stage records)
    RUN_DIR/checkpoints/                   the resume checkpoint (training/checkpoint.py)

Adapter directories are named after the role's adapter (`Role.adapter`): the name the engine, the
checkpoint and the serving registry all key adapters by.

`RunFiles` reads a run as serving needs it (roles, router, graph, bases, adapter versions) with nothing
of training; training's `RunDir` (training/run_dir.py) is a `RunFiles` that also trains.
"""

from __future__ import annotations

import json
import os
import re
import time
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from teamtr.graphs.engine import DEFAULT_BASE
from teamtr.graphs.roles import Role
from teamtr.graphs.spec import (
    DefaultRoles,
    SpecError,
    TaskConfig,
    TeamConfig,
    build_team,
    team_options,
    team_roles,
)

DEFAULT_RUN_DIR = "runs/teamtr"  # a training config's run_dir when it names none
CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
BASES_FILE = "base_models.json"
ADAPTERS = "adapters"
ADAPTER_WEIGHTS = "adapter_model.safetensors"  # peft's file names in a version directory
ADAPTER_CONFIG = "adapter_config.json"
_VERSION_DIR = re.compile(r"^v(\d+)$")


class RunDirError(SpecError):
    """A user mistake about a run or its config (bad or old config, no adapters, unknown role): the CLI
    prints its message as one line, as it does FileNotFoundError (a path that is not a run)."""


def adapter_dir(run_dir: str | Path, adapter: str, version: int) -> Path:
    return Path(run_dir) / ADAPTERS / adapter / f"v{version}"


def version_of(path: str | Path) -> int | None:
    """N of a `v<N>` version directory's name (None for any other name)."""
    m = _VERSION_DIR.match(Path(path).name)
    return int(m.group(1)) if m else None


def version_dirs(run_dir: str | Path, adapter: str) -> list[tuple[int, Path]]:
    """(version, directory) of every saved version of `adapter` in a run directory, oldest first."""
    root = Path(run_dir) / ADAPTERS / adapter
    found = []
    if root.is_dir():
        for d in root.iterdir():
            v = version_of(d)
            if v is not None and d.is_dir():
                found.append((v, d))
    return sorted(found)


def run_of_version_dir(path: str | Path) -> tuple[Path, str] | None:
    """(run directory, adapter) when `path` is a run's `adapters/<adapter>/v<N>` directory, else None."""
    path = Path(path)
    run = path.parent.parent.parent
    if version_of(path) is None or path.parent.parent.name != ADAPTERS or not (run / CONFIG_FILE).is_file():
        return None
    return run, path.parent.name


def _json_lines(path: Path) -> list[dict[str, Any]]:
    """Every complete JSON line of a log (a line cut short by kill -9 mid-write is skipped)."""
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def read_metrics(path: str | Path, kind: str | None = None) -> list[dict[str, Any]]:
    """The records (of one `kind`, or all) of a run's metrics.jsonl (`path`: the run or the file). A
    missing file is an error (FileNotFoundError)."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    return [r for r in _json_lines(path) if kind is None or r.get("kind") == kind]


def append_record(path: str | Path, event: str, **fields: Any) -> dict[str, Any]:
    """Append one `event` record (with its time) to a JSONL event log (promotions.jsonl, an improve run's
    decisions.jsonl and watch.jsonl), fsynced before it returns: what it records survives a kill -9."""
    now = time.time_ns()
    record = {"event": event, "time": datetime.fromtimestamp(now / 1e9, UTC).isoformat(), "time_ns": now, **fields}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return record


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Every complete record of a JSONL event log; a missing log has none."""
    path = Path(path)
    return _json_lines(path) if path.is_file() else []


def versions_after_stage(run_dir: str | Path, stage_count: int) -> dict[str, int]:
    """adapter -> its version once `stage_count` stages were done (0: v0, the warm start), from the run's
    update and revert records (stages numbered from 1): a rejected update leaves the version where it was."""
    run_dir = Path(run_dir)
    records = read_records(run_dir / METRICS_FILE)  # one read; a run without metrics has done no stage
    finished = sum(r.get("kind") == "stage" for r in records)
    if not 0 <= stage_count <= finished:
        raise RunDirError(
            f"{run_dir}: stage {stage_count} is not one of this run's 0..{finished} (0: the start)"
        )
    versions: dict[str, int] = {}
    # a "revert" record (eval.keep_best undid a stage) moves an adapter to a new version like an update
    for u in (r for r in records if r.get("kind") in ("update", "revert")):
        versions.setdefault(u["adapter"], 0)
        if u["stage"] <= stage_count:
            versions[u["adapter"]] = u["version_after"]
    return versions


def read_team_sections(path: Path) -> tuple[TeamConfig, TaskConfig]:
    """The `team` and `task` sections of a run's config.yaml (the rest is training's)."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError("not a mapping")
        return TeamConfig(**(data.get("team") or {})), TaskConfig(**(data.get("task") or {}))
    except (ValueError, yaml.YAMLError) as e:  # pydantic's ValidationError is a ValueError
        raise RunDirError(f"{path}: {' '.join(str(e).split())}") from None


class RunFiles:
    """An existing run directory read as a team: roles, router or graph, bases, adapter versions.

    `default_roles` is the task's own team when the config names no roles (tasks/roles.py's)."""

    def __init__(self, path: str | Path, default_roles: DefaultRoles) -> None:
        self.path = Path(path)
        if not self.path.is_dir():  # a path mistake: FileNotFoundError, as for any missing file
            raise FileNotFoundError(
                f"{self.path} is not a directory (want a run directory written by teamtr train)"
            )
        if not (self.path / CONFIG_FILE).is_file():
            raise FileNotFoundError(f"{self.path} is not a run directory (no {CONFIG_FILE})")
        self._default_roles = default_roles
        self.team_config, self.task_config = self._read_sections()

    def _read_sections(self) -> tuple[TeamConfig, TaskConfig]:
        return read_team_sections(self.path / CONFIG_FILE)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r})"

    def rollout_temperature(self) -> float:
        """The temperature the run trains pi_T at (its config's rollout.temperature; default 1)."""
        data = yaml.safe_load((self.path / CONFIG_FILE).read_text()) or {}
        return float((data.get("rollout") or {}).get("temperature", 1.0))

    def open_team_options(self) -> dict[str, Any]:
        """The router and max_turns, loaded once (a router that cannot be imported fails here)."""
        try:
            return team_options(self.team_config)
        except SpecError as e:
            raise RunDirError(f"{self.path / CONFIG_FILE}: {e}") from None

    @cached_property
    def team_options(self) -> dict[str, Any]:
        return self.open_team_options()

    # ---- what the config names --------------------------------------------------------------------
    @cached_property
    def roles(self) -> list[Role]:
        return team_roles(self.team_config, self.task_config, self._default_roles)

    def role(self, name: str) -> Role:
        """A role by its name (or by its adapter's name)."""
        for r in self.roles:
            if name in (r.name, r.adapter):
                return r
        raise RunDirError(
            f"{self.path}: unknown role {name!r}; the team's roles are {[r.name for r in self.roles]}"
        )

    def team(self, roles: list[Role], engine: Any, *, temperature: float | None = None, name: str = "team"):
        """A team of `roles` on `engine` taking turns by the run's router, or the run's graph."""
        return build_team(
            self.team_config, roles, engine, temperature=temperature, name=name, options=self.team_options
        )

    # ---- base models ------------------------------------------------------------------------------
    def recorded_bases(self) -> dict[str, str]:
        """The base models the run trained on, as training recorded them ({} for a run from before)."""
        f = self.path / BASES_FILE
        return json.loads(f.read_text()) if f.is_file() else {}

    def default_model(self) -> str:
        """The default base's model: `team.model`, else the one the run recorded."""
        if self.team_config.model:
            return self.team_config.model
        recorded = self.recorded_bases().get(DEFAULT_BASE)
        if recorded is None:
            raise RunDirError(
                f"{self.path}: team.model is null and the run records no base model ({BASES_FILE}); "
                "a run trained by this teamtr records it"
            )
        return recorded

    def base_paths(self, roles: list[Role] | None = None) -> dict[str, str]:
        """Base name -> model directory of every base the roles sit on (the default base only when a role
        uses it: a fully swapped team needs none)."""
        roles = self.roles if roles is None else roles
        used = {r.base_model for r in roles}
        unknown = sorted(used - {DEFAULT_BASE, *self.team_config.bases})
        if unknown:
            raise RunDirError(
                f"{self.path / CONFIG_FILE}: roles sit on bases {unknown} that team.bases does not name"
            )
        default = {DEFAULT_BASE: self.default_model()} if DEFAULT_BASE in used else {}
        return {**default, **{b: p for b, p in self.team_config.bases.items() if b in used}}

    # ---- adapters ----------------------------------------------------------------------------------
    def adapter_dir(self, adapter: str, version: int) -> Path:
        return adapter_dir(self.path, adapter, version)

    def adapter_versions(self, adapter: str) -> list[tuple[int, Path]]:
        """(version, directory) of every saved version of `adapter`, oldest first."""
        return version_dirs(self.path, adapter)

    def stage_versions(self, stage: int | None) -> dict[str, int] | None:
        """The `versions` argument of `saved_adapters` for the adapters after `stage` stages
        (versions_after_stage); None (the newest) when no stage is given."""
        return None if stage is None else versions_after_stage(self.path, stage)

    def saved_adapters(
        self, versions: int | dict[str, int] | None = None, roles: list[Role] | None = None
    ) -> dict[str, tuple[int, Path]]:
        """adapter -> (version, directory) for every role: the newest saved version, or `versions` (one
        number for all, or adapter -> number)."""
        roles = self.roles if roles is None else roles
        out: dict[str, tuple[int, Path]] = {}
        missing = []
        for r in roles:
            if r.adapter is None or r.adapter in out:
                continue
            found = dict(self.adapter_versions(r.adapter))
            want = versions.get(r.adapter) if isinstance(versions, dict) else versions
            if not found:
                missing.append(r.adapter)
            elif want is None:
                newest = max(found)
                out[r.adapter] = (newest, found[newest])
            elif want in found:
                out[r.adapter] = (want, found[want])
            else:
                raise RunDirError(
                    f"{self.path}: adapter {r.adapter!r} has no version {want} (has {sorted(found)})"
                )
        if missing:
            raise RunDirError(
                f"{self.path} has no saved adapters for {missing} (adapters/<adapter>/v<N>/): train it first"
            )
        return out
