"""No product module grows past 450 lines (issue #38's bound for a module that does one job): one over it
is split by job into modules named after them (training/teamtr_step.py -> probe_check.py, ...)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ["graphs", "tasks", "engines", "client", "serving", "training", "theory", "evals", "improve", "cli"]
MOST_LINES = 450


def test_no_product_module_is_over_the_bound():
    sizes = {
        p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines())
        for layer in LAYERS
        for p in (ROOT / layer).rglob("*.py")
    }
    assert len(sizes) > 100  # every layer was read
    over = {path: n for path, n in sorted(sizes.items()) if n > MOST_LINES}
    assert not over, f"split these by job: {over}"
