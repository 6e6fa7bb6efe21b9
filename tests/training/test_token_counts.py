"""The three token counts of a run (training/token_counts.py): the prefix-cache model's uncached prefill
equals a brute-force longest-common-prefix search over everything sampled before under the same adapter
version, on hand-made turns and on a real batch of the tiny team; an update's log-prob passes count
(1 + 2 x epochs) passes over its messages; a real run reports all three, and suffix resampling's
premium over a stale run is smaller counted the third way than the first."""

from __future__ import annotations

import pytest
import torch

from teamtr.graphs.trajectory import Turn
from teamtr.training.rollouts import messages_of_role
from teamtr.training.token_counts import PrefixCache, pass_tokens, three_counts
from tests.support.trainer import (  # importing it registers the trainer tests' task
    small_config,
    stage_team,
    train,
)

torch.set_num_threads(1)


def turn(prompt: list[int], completion: list[int], adapter: str = "a", version: int = 0) -> Turn:
    return Turn("r", adapter, version, prompt, completion, [0.0] * len(completion), "")


def brute_force_prefill(turns: list[Turn]) -> int:
    """Each turn's prompt minus its longest common prefix with any earlier turn's prompt + completion
    under the same (base, adapter, version): what the trie computes, searched pairwise."""
    seen: list[tuple[tuple, list[int]]] = []
    total = 0
    for t in turns:
        key = (t.base_model, t.adapter, t.adapter_version)
        best = 0
        for k, seq in seen:
            if k != key:
                continue
            common = 0
            for a, b in zip(t.prompt_ids, seq, strict=False):
                if a != b:
                    break
                common += 1
            best = max(best, common)
        total += len(t.prompt_ids) - best
        seen.append((key, [*t.prompt_ids, *t.completion_ids]))
    return total


def test_prefix_cache_prefills_only_what_no_sequence_of_the_same_version_covers():
    cache = PrefixCache()
    assert cache.prefill(turn([1, 2, 3], [4])) == 3  # nothing cached
    assert cache.prefill(turn([1, 2, 3], [5])) == 0  # the same prompt: all cached
    assert cache.prefill(turn([1, 2, 3, 4, 9], [6])) == 1  # extends prompt + completion [1, 2, 3, 4]
    assert cache.prefill(turn([1, 2, 7], [6])) == 1  # shares [1, 2]
    assert cache.prefill(turn([1, 2, 3], [4], adapter="b")) == 3  # another adapter's KV is not this one's
    assert cache.prefill(turn([1, 2, 3], [4], version=1)) == 3  # a new version: its cache starts empty
    assert cache.prefill(turn([1, 2, 3], [4], version=0)) == 3  # ... and the old version's is gone


def test_prefix_cache_agrees_with_a_brute_force_search_on_random_turns():
    gen = torch.Generator().manual_seed(0)
    turns = []
    for _ in range(200):  # short sequences over 3 tokens: many shared prefixes
        prompt = torch.randint(0, 3, (int(torch.randint(1, 8, (1,), generator=gen)),), generator=gen).tolist()
        completion = torch.randint(0, 3, (int(torch.randint(1, 4, (1,), generator=gen)),), generator=gen).tolist()
        turns.append(turn(prompt, completion, adapter="ab"[int(torch.randint(0, 2, (1,), generator=gen))]))
    assert PrefixCache().sampled(turns) == brute_force_prefill(turns)


@pytest.mark.parametrize("check", ["sampled", "probe"])
def test_a_batch_counts_its_prefill_and_an_update_counts_its_passes(tiny_model, tmp_path, check):  # noqa: F811
    from teamtr.training.stage import UpdateContext

    # delta large and no early stop: one attempt of every epoch, so the passes are exactly known
    # (extrapolation off: its scaled point adds passes this count does not model)
    cfg = small_config(
        tiny_model, tmp_path / "run",
        **{"trust_region.delta": 1e9, "trust_region.check": check, "trust_region.extrapolate": False},
    )  # fmt: skip
    team = stage_team(cfg, tiny_model)
    batch = team.rollout(0, 0)
    turns = [t for traj in batch.trajectories for t in traj.turns]
    assert team.state.train_prefill_tokens == brute_force_prefill(turns)
    # the group's G episodes share their first prompt: it is prefilled once per group, not once per episode
    assert team.state.train_prefill_tokens < sum(len(t.prompt_ids) for t in turns)

    ctx = UpdateContext(0, 1, "adder1", batch, batch, fresh=True, reweight=False)
    probe = team.probe_contexts(ctx)  # the seeded episodes the update draws again
    update = team.update(ctx)
    assert update.accepted and len(update.record["attempts"]) == 1
    msgs = messages_of_role(batch, "adder1", _advantages(batch, cfg))
    per_pass = pass_tokens(msgs.prompts, msgs.completions)
    if check == "sampled":
        # pi_old's scoring, then per epoch the training pass and the whole-batch KL pass; the instruments
        # around the step (stale gap, held-out KL) are not counted
        assert team.state.train_pass_tokens == (1 + 2 * cfg.optim.epochs) * per_pass
    else:
        # pi_old's scoring, the epochs' training passes, pi_new's pass at the end, and after every optimiser
        # step the exact KL's pi_now pass over the batch's and the probe's messages (pi_cur's pass only at
        # the first check: its states are kept)
        steps = update.record["optimiser_steps"]
        assert steps == cfg.optim.epochs * -(-len(msgs) // cfg.optim.minibatch_messages)
        region = (steps + 1) * (per_pass + pass_tokens(*probe))
        assert team.state.train_pass_tokens == (2 + cfg.optim.epochs) * per_pass + region
    assert update.record["train_pass_tokens"] == team.state.train_pass_tokens
    assert update.record["train_prefill_tokens"] == team.state.train_prefill_tokens


def _advantages(batch, cfg):
    from teamtr.training.advantages import advantages_for

    return advantages_for(batch.rewards, batch.groups, cfg.loss)


def test_a_run_reports_three_counts_and_the_resampling_premium_shrinks_with_each(tiny_model, tmp_path):  # noqa: F811
    teamtr = three_counts(train(small_config(tiny_model, tmp_path / "teamtr"))[-1])
    naive = three_counts(train(small_config(tiny_model, tmp_path / "naive", **{"schedule.kind": "naive"}))[-1])
    ratios = [t / n for t, n in zip(teamtr, naive, strict=True)]
    assert all(c > 0 for c in (*teamtr, *naive))
    assert ratios[0] > 1.5, ratios  # measured 2.7: two more batches per stage, in part
    # the training passes, of the same number of updates on batches of the same size in both arms, dilute
    # the premium (measured 0.73: naive's stale updates here passed over more tokens than TeamTR's)
    assert ratios[2] < ratios[0] - 0.5, ratios
