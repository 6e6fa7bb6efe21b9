"""The gate's and the canary's tests (improve/stats.py): the exact sign test and the paired
t-test at a fixed number of prompts, their stated error rate and power; the canary's betting test, its
false-promotion rate when looked at after every pair and its power, by simulation of the function that
decides (fixed seeds and sizes: each figure is a deterministic function of the code); the sizing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from teamtr.improve.stats import (
    canary_bounds,
    canary_crossings,
    canary_promoted,
    canary_simulate,
    gate_power,
    gate_prompts_for,
    gate_test,
    sizing,
)


def test_gate_sign_test_is_exact_mcnemar_on_the_discordant_prompts():
    # 9 prompts won, 1 lost, 2 ties: p = P(Binomial(10, 1/2) >= 9) = 11 / 1024
    c = [1.0] * 9 + [0.0] + [1.0, 0.0]
    i = [0.0] * 9 + [1.0] + [1.0, 0.0]
    t = gate_test(c, i, 0, 1, 0.95)
    assert t.method.startswith("exact sign test") and (t.wins, t.losses, t.n) == (9, 1, 12)
    assert t.p_value == pytest.approx(11 / 1024) and t.passed and t.lower > 0
    # the bound and the test say the same thing: 4 won of 4 discordant (p 1/16) fails, 5 of 5 passes
    assert not gate_test([1.0] * 4, [0.0] * 4, 0, 1, 0.95).passed
    five = gate_test([1.0] * 5, [0.0] * 5, 0, 1, 0.95)
    assert five.passed and five.lower > 0 and five.p_value == pytest.approx(1 / 32)
    assert gate_test([1.0] * 4, [0.0] * 4, 0, 1, 0.95).lower < 0
    assert gate_test([0.0] * 6, [0.0] * 6, 0, 1, 0.95).p_value == 1.0  # no discordant prompt
    with pytest.raises(ValueError, match="pairs prompts"):
        gate_test([1.0], [1.0, 0.0], 0, 1, 0.95)


def test_gate_t_test_for_graded_rewards_and_margins():
    rng = np.random.default_rng(0)
    c, i = rng.random(40) * 0.5 + 0.3, rng.random(40) * 0.5
    t = gate_test(c, i, 0, 1, 0.95)
    assert t.method == "paired t-test" and t.passed and 0 < t.lower < t.mean
    # a margin the range alone proves (>= hi - lo) passes whatever the data, at any n
    assert gate_test([0.0], [1.0], 0, 1, 0.95, margin=2).passed
    assert gate_test([0.0] * 3, [0.0] * 3, 0, 1, 0.95, margin=2).passed
    assert not gate_test([0.0] * 30, [1.0] * 30, 0, 1, 0.95, margin=0.5).passed


def test_gate_error_rate_and_power_meet_the_issue_figures():
    # exact (no simulation): at no difference the sign test passes <= 5% at every n ...
    assert max(gate_power(0.0, n, 0.95) for n in (12, 32, 48, 64, 128, 256, 512)) <= 0.05
    # ... and +0.2 at 128 prompts, +0.1 at 512 pass >= 80% of the time (binary rewards at 0.5, arms
    # independent: no pairing gain)
    assert gate_power(0.2, 128, 0.95) >= 0.8 and gate_power(0.1, 512, 0.95) >= 0.8
    # the exact power is the decision's: 400 simulated gates at 128 prompts, +0.2 (fixed seed)
    rng = np.random.default_rng(0)
    passed = [
        gate_test(
            (rng.random(128) < 0.7).astype(float), (rng.random(128) < 0.5).astype(float), 0, 1, 0.95
        ).passed
        for _ in range(400)
    ]
    assert abs(np.mean(passed) - gate_power(0.2, 128, 0.95)) < 0.05
    assert 128 < gate_prompts_for(0.1, 0.95) <= 512


def test_canary_betting_test_error_rate_and_power():
    # looked at after every one of 1000 pairs, a candidate as good as the incumbent is promoted in at
    # most 2.5% of 2000 simulated canaries (Ville's inequality guarantees it; here the simulation of the
    # deciding function, fixed seed)
    assert canary_promoted(0.0, 1000, 0.95, runs=2000) <= 0.025
    assert canary_promoted(-0.1, 1000, 0.95, runs=400) <= 0.025
    # power, arms independent (pairing by prompt only adds to it): +0.2 within 200 pairs, +0.1 within 1000
    assert canary_promoted(0.2, 200, 0.95, runs=2000) >= 0.9
    assert canary_promoted(0.1, 1000, 0.95, runs=1000) >= 0.8
    # a worse candidate is rolled back early as shown worse
    up, down = canary_simulate(-0.2, 400, 0.95, runs=200)
    assert np.mean(down < 400) > 0.9 and not np.any(up < down)


def test_canary_bounds_agree_with_the_decision_and_margins():
    d = np.ones(13)  # every pair won: the promote test crosses at pair 13
    up, down = canary_crossings(d, 0, 1, 0.95)
    assert (int(up), int(down)) == (12, 13)
    assert canary_bounds(d, 0, 1, 0.95).lower > 0 and canary_bounds(d[:12], 0, 1, 0.95).lower <= 0
    # non-inferiority beyond the range: decided at the first pair
    assert int(canary_crossings(-np.ones(3), 0, 1, 0.95, margin=2)[0]) == 0
    assert [int(x) for x in canary_crossings(np.zeros(0), 0, 1, 0.95)] == [0, 0]  # no pair yet: undecided
    b = canary_bounds([], 0, 1, 0.95)
    assert b.n == 0 and (b.lower, b.upper) == (-1, 1)


def test_sizing_says_what_the_window_can_detect():
    lines = sizing(12, 48, 0.25, 0.95, 400, 0.5, 0.95)
    assert "12 held-out prompts" in lines[0] and "more served prompts" in lines[0]
    assert "raise --canary-episodes" in lines[1]
    need = int(lines[0].split("+0.1 needs ")[1].split()[0])
    assert need == gate_prompts_for(0.1, 0.95) and math.ceil(need / 0.25) - 48 > 0
