"""The evaluation of a run that trains its own LangGraph graph (team.graph, docs/graphs.md), for
`teamtr eval RUN_DIR` (cli/graph_eval.py prints it).

The run's graph is evaluated as it was trained and is served (training/run_dir.py `build_team`), twice on
the same instances with the same episode seeds: with its v0 adapters (the start) and with its newest ones
(or those after `stage`), so the change is paired per instance (evals/compare.py).

What scores an episode, first that applies:
  --verifier module:attr   an object with `verify(task, response)` (a TaskFamily), or a function
                           `(task, response) -> float`, on the graph's answer (team.output);
  --task FAMILY            that task family's instances and its verifier on the answer;
  the run's team.reward    `(task, final state) -> float`, on the run's own tasks (task.data or task.name);
  neither                  the run's task family's verifier on the answer (task.data: an exact match).

The best-of-N baseline (one model, the run's base without adapters, N samples at the team's tokens) needs
a verifier on the answer: a single model has no graph state for team.reward to read.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from teamtr.evals.harness import EvalResult
from teamtr.graphs.task import TaskFamily, TaskInstance


class GraphEvalError(ValueError):
    """A graph run's evaluation asked for what it cannot do; `option` names the command-line option at fault."""

    def __init__(self, message: str, option: str) -> None:
        super().__init__(message)
        self.option = option


@dataclass
class VerifierFamily:
    """A task family whose verifier (and answer extraction, when it has one) is the `--verifier` object."""

    base: TaskFamily
    verifier: Any
    spec: str

    @property
    def name(self) -> str:
        return self.base.name

    @property
    def description(self) -> str:
        return f"{self.base.description}, scored by {self.spec}"

    def generate(self, n: int, seed: int, **difficulty: Any) -> list[TaskInstance]:
        return self.base.generate(n, seed, **difficulty)

    def extract_answer(self, response: str) -> str | None:
        extract = getattr(self.verifier, "extract_answer", None) or self.base.extract_answer
        return extract(response)

    def verify(self, instance: TaskInstance, response: str) -> float:
        verify = getattr(self.verifier, "verify", self.verifier)
        try:
            return float(verify(instance, response))
        except Exception as e:
            raise ValueError(
                f"--verifier {self.spec} failed on task {instance.id!r}: {type(e).__name__}: {e}"
            ) from e


def load_verifier(spec: str, base: TaskFamily) -> VerifierFamily:
    from teamtr.graphs.loading import load_object

    obj = load_object(spec, "--verifier")
    if not callable(getattr(obj, "verify", obj)):
        raise GraphEvalError(
            f"{spec} is a {type(obj).__name__}: want an object with verify(task, response) or such a function",
            "--verifier",
        )
    return VerifierFamily(base, obj, spec)


def graph_run_config(source: str | None) -> Any | None:
    """The TrainConfig of `source` when it is a run directory whose team is a user graph, else None
    (read without the engine's imports: a wrong path still answers at once)."""
    if source is None or not (Path(source) / "config.yaml").is_file():
        return None
    from teamtr.training.config_file import read_config

    cfg = read_config(Path(source) / "config.yaml")
    return cfg if cfg.team.graph is not None else None


def run_instances(family: TaskFamily, limit: int, seed: int) -> list[TaskInstance]:
    """`limit` of the run's own tasks; a fixed list (task.data) is drawn without repeats, at most whole."""
    fixed = getattr(family, "tasks", None)
    return family.generate(min(limit, len(fixed)) if fixed is not None else limit, seed)


def held_out_tasks(run: Any, data: Path | None) -> tuple[TaskFamily, str]:
    """The tasks a graph run is evaluated on when no --task is named, and where they come from: --data FILE,
    else the run's task.eval_data, else its training tasks (said to be so: they are not held out)."""
    from teamtr.graphs.user_graph import UserGraphError, data_family

    if data is not None:
        try:
            return data_family(str(data), run.config.task.name, key="--data", whole=True), f"--data {data}"
        except UserGraphError as e:
            raise GraphEvalError(str(e), "--data") from None
    if run.config.task.eval_data is not None:
        return run.eval_task(), f"task.eval_data {run.config.task.eval_data}"
    return run.task(), "the run's training tasks (not held out: give --data FILE or task.eval_data)"


def _with_tokens(roles: list[Any], max_new_tokens: int | None) -> list[Any]:
    if max_new_tokens is None:
        return roles
    return [
        dataclasses.replace(r, sampling=dataclasses.replace(r.sampling, max_new_tokens=max_new_tokens))
        for r in roles
    ]


@dataclass
class GraphEvaluation:
    """Before and after of a graph run on the same instances and seeds, with the paired change."""

    run_path: Path
    graph: str  # team.graph, module:factory
    scored_by: str
    tasks_from: str
    temperature: float
    labels: tuple[str, str]  # ("v0", "newest" or "stage N")
    role_versions: dict[str, dict[str, int]]  # label -> role -> the adapter version it ran
    before: EvalResult
    after: EvalResult  # with the best-of-N baseline when asked
    change: dict[str, Any]

    def summary(self) -> dict[str, Any]:
        """result.json: the after side's result, where it ran and the before side and the change."""
        return {
            **self.after.as_dict(),
            "run": str(self.run_path),
            "scored_by": self.scored_by,
            "tasks_from": self.tasks_from,
            "temperature": self.temperature,
            "after": self.labels[1],
            "before": {"label": self.labels[0], **self.before.as_dict()},
            "change": self.change,
            "versions": {
                "before": self.role_versions[self.labels[0]],
                "after": self.role_versions[self.labels[1]],
            },
        }

    def save(self, out_dir: Path) -> list[Path]:
        """result.json (the summary), the after side's episodes and plots in `out_dir`, the before side's
        in `out_dir`/before; the plots written."""
        from teamtr.evals.report import plot_result

        self.after.save(out_dir)
        (out_dir / "result.json").write_text(json.dumps(self.summary(), indent=2))
        self.before.save(out_dir / "before")
        return plot_result(self.after, out_dir)


def evaluate_graph_run(
    run_dir: Path,
    *,
    family: TaskFamily | None,
    instances: list[TaskInstance] | None,
    data: Path | None = None,
    verifier: str | None,
    k: int,
    limit: int,
    seed: int,
    baseline: bool,
    stage: int | None,
    single_turns: int | None,
    temperature: float,
    max_new_tokens: int | None,
    batch_size: int,
    threads: int,
    show_progress: bool = True,
) -> GraphEvaluation:
    """Before (v0) and after (newest, or `stage`) of a graph run on the same instances and seeds, with the
    paired change, and the single-model best-of-N baseline when asked. `family` None: the run's own tasks
    (`data`, else task.eval_data, else its training tasks)."""
    from teamtr.evals.compare import paired_change
    from teamtr.evals.harness import best_of_n, evaluate
    from teamtr.evals.runners import EngineRunners
    from teamtr.training.run_dir import RunDir

    run = RunDir(run_dir)
    team_cfg = run.config.team
    tasks_from = "--task"
    if family is None:  # the run's own tasks: --data, else task.eval_data, else the training list
        family, tasks_from = held_out_tasks(run, data)
        instances = run_instances(family, limit, seed)
        scored_by = f"team.reward {team_cfg.reward}" if team_cfg.reward else f"the {family.name} verifier"
        rewarded = True
    else:
        scored_by = f"the {family.name} verifier"
        rewarded = False
    if verifier is not None:
        family = load_verifier(verifier, family)
        scored_by, rewarded = f"--verifier {verifier}", False
    if baseline and rewarded and team_cfg.reward is not None:
        raise GraphEvalError(
            f"the run's reward ({team_cfg.reward}) reads the graph's final state, which a single model does "
            "not have: name a verifier of the answer (--verifier module:attr) or a task family (--task) to "
            "compare with best-of-N",
            "--baseline",
        )
    roles = _with_tokens(run.roles, max_new_tokens)
    budget = max_new_tokens or max(r.sampling.max_new_tokens for r in roles)
    results = {}
    baseline_result = None
    labels = ("v0", "newest" if stage is None else f"stage {stage}")
    compared = {labels[0]: run.stage_versions(0), labels[1]: run.stage_versions(stage)}
    role_versions = {  # role -> the adapter version each side runs
        label: {r.name: run.saved_adapters(v, roles)[r.adapter][0] for r in roles if r.adapter}
        for label, v in compared.items()
    }
    for label, versions in compared.items():
        engine = run.engine(version=versions, threads=threads)
        team = run.team(roles, engine, temperature=temperature, name=run.path.resolve().name)
        runners = EngineRunners(
            engine, roles, family, temperature=temperature, max_new_tokens=budget, seed=seed
        )
        try:
            results[label] = evaluate(
                family, instances, runners.graph(team, rewarded), k, batch_size, show_progress, seed
            )
            if baseline and label == labels[1]:  # the base model alone, at the newest team's tokens
                single = runners.single(turns=single_turns)
                baseline_result = best_of_n(
                    family, instances, single, results[label], batch_size, show_progress
                )
        finally:
            runners.close()
        del engine, team, runners  # one engine at a time: the next stage's replaces it
    before, after = results[labels[0]], results[labels[1]]
    after.baseline = baseline_result
    return GraphEvaluation(
        run_path=run.path,
        graph=str(team_cfg.graph),
        scored_by=scored_by,
        tasks_from=tasks_from,
        temperature=temperature,
        labels=labels,
        role_versions=role_versions,
        before=before,
        after=after,
        change=paired_change(before, after, seed),
    )
