"""A candidate team under canary: which adapter versions it replaces, which share of new episodes it
serves, and which episodes got it (serving/registry.py `AdapterRegistry.pin` asks it once per episode).

The draw is per episode, not per adapter: an episode either pins the candidate version of every adapter
the candidate covers, or the incumbent (current) version of every one of them, never a mix. Which
episodes are canaries is deterministic (a running count: after n episodes, floor(n * share) of them
were canaries), so a configured share is met exactly rather than on average.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Candidate:
    """Candidate versions of some adapters (adapter -> version), with where they came from."""

    versions: dict[str, int]
    incumbent: dict[str, int]  # the current version of each adapter when the candidate was loaded
    lineage: dict[str, Any] = field(default_factory=dict)  # run, data window, ... (the caller's record)
    share: float = 0.0  # of new episodes that pin the candidate (0: loaded only, e.g. while gated)
    episodes: int = 0  # episodes drawn since the share was last set
    canary_episodes: int = 0  # of them, pinned to the candidate
    total_canary_episodes: int = 0  # over the candidate's life
    # each canary episode is answered again by the incumbent on the same request, a shadow episode whose
    # answer is not returned (serving/episodes.py), so the canary can compare the two on the same prompt
    shadow: bool = False

    def set_share(self, share: float) -> None:
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"canary share must be in [0, 1], got {share}")
        self.share, self.episodes, self.canary_episodes = share, 0, 0

    def draw(self) -> bool:
        """Whether the next episode pins the candidate (every adapter it covers at once)."""
        self.episodes += 1
        take = math.floor(self.episodes * self.share + 1e-9) > self.canary_episodes
        if take:
            self.canary_episodes += 1
            self.total_canary_episodes += 1
        return take
