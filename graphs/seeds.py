"""Seeds derived from their parts: every random choice of an episode, a rollout or a minibatch is seeded
by `derive_seed(run seed, what, where...)`, so a seeded run reproduces in any process.
"""

from __future__ import annotations

import hashlib
from typing import Any


def derive_seed(*parts: Any) -> int:
    """A stable 63-bit seed from any parts (Python's hash() is salted per process)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1
