"""training/report.py's figures as a reader needs them: error bars of +-1 binomial standard error on
the per-stage returns, integer ticks where the axis counts stages or updates, the test accuracies
before and after training plotted, and the base weights' sha256 in every figure's footer."""

from __future__ import annotations

import matplotlib.figure
import pytest
import yaml
from matplotlib.container import ErrorbarContainer

from teamtr.training.metrics import MetricsLog
from teamtr.training.report import run_weights, write_report
from teamtr.training.warmstart.shipped import SHIPPED_DIR, weights_digest


def write_run(path, returns: list[float], episodes: int) -> None:
    """A run's metrics as the trainer logs them: the start's evaluation, 3 updates per stage, stages."""
    log = MetricsLog(path, tensorboard=False)
    log.log("eval", 0, stage=0, accuracy=returns[0], episodes=episodes)  # stage 0: the start
    step = 0
    for stage, (before, after) in enumerate(zip(returns, returns[1:], strict=False), start=1):
        for index in (1, 2, 3):
            step += 1
            log.log("update", step, stage=stage, index=index, adapter=f"adder{index}", accepted=True,
                    version_after=stage, attempts=[], d_hat=0.01 * index, delta=0.05,
                    stale_gap=0.001 * index if index >= 2 else None)  # fmt: skip
        log.log("stage", step, stage=stage, eval_before=before, eval_after=after, certificate=0.01,
                realised_improvement=after - before)  # fmt: skip
    log.close()


@pytest.fixture
def figures(monkeypatch) -> dict[str, matplotlib.figure.Figure]:
    """Every figure the report saves, by file name (observed as it is written)."""
    seen: dict[str, matplotlib.figure.Figure] = {}
    save = matplotlib.figure.Figure.savefig

    def record(fig, path, *args, **kwargs):
        seen[path.name] = fig
        return save(fig, path, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", record)
    return seen


def test_report_figures_carry_error_bars_integer_ticks_and_the_weights_digest(tmp_path, figures):
    run = tmp_path / "run"
    write_run(run, [0.30, 0.45, 0.50], episodes=100)
    model = SHIPPED_DIR / "chain-demo"
    (run / "config.yaml").write_text(yaml.safe_dump({"team": {"model": str(model)}}))
    digest = weights_digest(model)
    assert run_weights(run) == digest

    tests = {"warm start": {"accuracy": 0.40, "episodes": 300}, "stage 2 (chosen)": {"accuracy": 0.5, "episodes": 300}}
    paths = write_report([run], tmp_path / "report", test_accuracy=tests)
    assert sorted(p.name for p in paths) == sorted(
        ["return_per_stage.png", "kl_per_update.png", "certificate_vs_improvement.png", "stale_gap.png",
         "test_accuracy.png"]
    )  # fmt: skip
    ax = figures["return_per_stage.png"].axes[0]
    (bars,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    _, _, (segments,) = bars.lines
    half = [(seg[1][1] - seg[0][1]) / 2 for seg in segments.get_segments()]
    assert half == pytest.approx([(p * (1 - p) / 100) ** 0.5 for p in (0.30, 0.45, 0.50)])
    for name in ("return_per_stage.png", "stale_gap.png", "kl_per_update.png"):
        ticks = figures[name].axes[0].get_xticks()
        assert all(float(t).is_integer() for t in ticks), (name, ticks)
    test_ax = figures["test_accuracy.png"].axes[0]
    assert [t.get_text() for t in test_ax.get_xticklabels()] == list(tests)
    assert [b.get_height() for b in test_ax.patches] == [0.40, 0.5]
    assert any(isinstance(c, ErrorbarContainer) for c in test_ax.containers)
    for name, fig in figures.items():
        assert any(digest[:12] in t.get_text() for t in fig.texts), name


def test_eval_plots_put_each_interval_on_its_estimate(tmp_path, figures):
    """evals/report.py: the team's pass@k and the single model's best-of-N carry their 95% intervals."""
    from teamtr.evals.harness import EvalResult
    from teamtr.evals.report import plot_result

    est = {"value": 0.6, "low": 0.5, "high": 0.7}
    result = EvalResult(task="chain", k=4, instances=10, episodes=40, pass_at_k=est, avg_at_k=est,
                        pass_at_k_curve={1: 0.3, 2: 0.45, 3: 0.55, 4: 0.6}, tokens_per_episode=30.0,
                        by_difficulty={"all": {"instances": 10, "pass_at_k": est}})  # fmt: skip
    plot_result(result, tmp_path / "plain")
    ax = figures["pass_at_k.png"].axes[0]
    (bar,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    (segment,) = bar.lines[2][0].get_segments()
    assert segment.tolist() == [[4.0, 0.5], [4.0, 0.7]]
    assert all(float(t).is_integer() for t in ax.get_xticks())
    result.baseline = {"n": 8, "team_tokens_per_episode": 30.0, "single_tokens_per_sample": 15.0,
                       "best_of_n": {"value": 0.5, "low": 0.4, "high": 0.6},
                       "pass_at_k_curve": {j: 0.1 * j for j in range(1, 9)}}  # fmt: skip
    plot_result(result, tmp_path / "baseline")
    bars = [c for c in figures["pass_at_k.png"].axes[0].containers if isinstance(c, ErrorbarContainer)]
    assert sorted(b.lines[2][0].get_segments()[0].tolist()[0][0] for b in bars) == [4.0, 4.0]  # 8 x 15/30


def test_stale_gap_and_certificate_plots_carry_error_bars_and_a_caption(tmp_path, figures):
    """issue 34 item 6: the stale gap per index is points with +-1 SE over the stages (not a line joining
    two means), and the certificate plot gives each stage's improvement its error bar and says that a
    Spearman over a few stages within their noise is no evidence either way."""
    run = tmp_path / "run"
    write_run(run, [0.30, 0.45, 0.50, 0.48], episodes=100)
    write_report([run], tmp_path / "report")
    stale = figures["stale_gap.png"].axes[0]
    (bars,) = [c for c in stale.containers if isinstance(c, ErrorbarContainer)]
    assert bars.lines[0].get_linestyle() == "None"  # markers only
    cert = figures["certificate_vs_improvement.png"]
    (bars,) = [c for c in cert.axes[0].containers if isinstance(c, ErrorbarContainer)]
    _, _, (segments,) = bars.lines
    half = [(seg[1][1] - seg[0][1]) / 2 for seg in segments.get_segments()]
    pairs = [(0.30, 0.45), (0.45, 0.50), (0.50, 0.48)]
    assert half == pytest.approx([((a * (1 - a) + b * (1 - b)) / 100) ** 0.5 for a, b in pairs])
    assert any("Spearman over 3 stages" in t.get_text() for t in cert.texts)
