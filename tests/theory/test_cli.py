"""`teamtr theory check` and `teamtr theory scaling` end to end (the Typer app the root CLI mounts)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from teamtr.cli.theory import app
from teamtr.theory.bounds import BOUND_NAMES

runner = CliRunner()


def run_json(*args: str) -> dict:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_check_reports_zero_violations_per_bound() -> None:
    out = run_json("check", "--instances", "200", "--json")
    assert out["instances"] == 200
    assert set(out["violations"]) == set(BOUND_NAMES)
    assert all(v == 0 for v in out["violations"].values())
    assert all(out["checks"][name] >= 200 for name in ("occupancy_shift", "thm34", "prop33"))
    assert all(0 <= f <= 1 for f in out["max_used_fraction"].values())


def test_check_with_a_tenth_of_the_constant_finds_violations() -> None:
    out = run_json("check", "--instances", "200", "--c-scale", "0.1", "--json")
    assert out["violations"]["occupancy_shift"] > 0


def test_scaling_json_has_exponents_table_and_ablation(tmp_path: Path) -> None:
    figure = tmp_path / "scaling.png"
    out = run_json("scaling", "--json", "--seeds", "1", "--stages", "2", "--out", str(figure))
    naive, teamtr = out["alpha_naive"], out["alpha_teamtr"]
    for fit in (naive, teamtr):
        lo, hi = fit["ci95"]
        assert lo <= fit["value"] <= hi
    assert naive["value"] > teamtr["value"] + 0.5  # stale rollouts cost a power of n more
    assert [row["n"] for row in out["table"]] == list(range(2, 9))
    for row in out["table"]:
        assert row["stale_gap_naive"] > row["stale_gap_teamtr"] > 0
        assert row["left_region_teamtr"] == 0.0
    ess = out["importance_weighting"]["by_delta"]["0.1"]
    assert ess["1"] == 1.0 or abs(ess["1"] - 1.0) < 1e-9
    assert ess["5"] < ess["2"] < 1.0  # the stale batch's weights degenerate along the stage
    assert out["seconds"] > 0
    assert Path(out["figure"]) == figure and figure.stat().st_size > 10_000
    lines = [json.loads(line) for line in Path(out["metrics"]).read_text().splitlines()]
    assert len([x for x in lines if x["kind"] == "run"]) == 7 * 4  # n = 2..8, four schedules, one seed
    assert lines[-1]["kind"] == "summary"


def test_scaling_rejects_a_single_team_size() -> None:
    result = runner.invoke(app, ["scaling", "--agents", "4", "--json"])
    assert result.exit_code != 0
    assert "two team sizes" in result.output
