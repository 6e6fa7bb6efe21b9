"""What a build produced and measured: `warmstart.json` (written last, with a hash of every file, so its
presence marks a complete build), the evaluation history and its plot."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from teamtr.training.warmstart.evaluate import TeamEval

REPORT_FILE = "warmstart.json"
HISTORY_FILE = "warmstart_history.jsonl"
CURVE_FILE = "warmstart_curve.png"


@dataclass
class WarmStartReport:
    """What a build produced and measured; saved as `warmstart.json` next to the model."""

    path: str
    config: dict
    seconds: float  # wall time of the whole build (reported only: nothing in the build depends on it)
    train_seconds: float
    optimizer_steps: int
    train_tokens: int
    in_band: bool
    greedy: TeamEval  # on `final_eval_tasks` fresh held-out tasks
    sampled: TeamEval  # temperature 1, `samples_per_task` episodes on each of `sampled_eval_tasks`
    pass_at_k: float  # fraction of tasks solved by at least one of `samples_per_task` sampled episodes
    k: int
    stopped_because: str
    rollbacks: int
    threads: int  # torch threads used
    history: list[dict] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # file name -> sha256, checked by the cache
    # the CPU code path and library versions of the build (shipped.build_environment): the weights'
    # last bits depend on them, so two machines' builds of one config can differ
    environment: dict = field(default_factory=dict)
    # set when a model is shipped for this config and this build's weights differ from it
    differs_from_shipped: str | None = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> WarmStartReport:
        d = dict(d)
        d["greedy"] = TeamEval(**d["greedy"])
        d["sampled"] = TeamEval(**d["sampled"])
        return cls(**d)

    def summary(self) -> str:
        steps = ", ".join(f"{a:.0%}" for a in self.greedy.step_accuracy)
        weights = self.files.get("model.safetensors", "")[:12]
        return (
            f"warm start: {self.seconds:.0f} s ({self.optimizer_steps} steps); greedy team accuracy "
            f"{self.greedy.team_accuracy:.1%} (per role {steps}), sampled {self.sampled.team_accuracy:.1%}, "
            f"pass@{self.k} {self.pass_at_k:.1%}; {'in' if self.in_band else 'OUTSIDE'} the target band; "
            f"weights sha256 {weights} (cpu {self.environment.get('cpu_capability', '?')})"
            + (f"\nWARNING: {self.differs_from_shipped}" if self.differs_from_shipped else "")
        )


def load_report(path: str | Path) -> WarmStartReport:
    return WarmStartReport.from_dict(json.loads((Path(path) / REPORT_FILE).read_text()))


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_report_files(report: WarmStartReport, out_dir: Path) -> None:
    """The history, its plot, then the report with every file's hash (atomically, last)."""
    with open(out_dir / HISTORY_FILE, "w") as f:
        for row in report.history:
            f.write(json.dumps(row) + "\n")
    _plot_history(report, out_dir / CURVE_FILE)
    report.files = {p.name: sha256(p) for p in sorted(out_dir.iterdir()) if p.is_file()}
    write_report(report, out_dir)


def write_report(report: WarmStartReport, out_dir: Path) -> None:
    tmp = out_dir / (REPORT_FILE + ".tmp")
    tmp.write_text(json.dumps(report.as_dict(), indent=1))
    tmp.replace(out_dir / REPORT_FILE)  # atomic: a reader sees the old report or the new one


def _plot_history(report: WarmStartReport, png: Path) -> None:
    if not report.history:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in report.history]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [r["team_accuracy"] for r in report.history], "k-o", ms=3, label="team (greedy)")
    for k in range(len(report.history[0]["step_accuracy"])):
        ax.plot(
            steps,
            [r["step_accuracy"][k] for r in report.history],
            "--",
            label=f"role {k + 1} (on correct input)",
        )
    ax.axhspan(*report.config["band"], color="green", alpha=0.1, label="target band")
    ax.set_xlabel("optimizer step (rollbacks replay earlier steps)")
    ax.set_ylabel("held-out accuracy")
    ax.set_ylim(0, 1)
    ax.set_title(f"warm start (supervised, {report.config.get('task', 'chain')} task)")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
