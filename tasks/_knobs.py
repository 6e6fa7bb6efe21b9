"""What every knob-driven task family shares: default difficulty knobs given to the constructor, the
knobs of one `generate` call, and each instance's seeded random generator and id."""

from __future__ import annotations

import dataclasses
import random
from typing import Any, ClassVar, Generic, TypeVar

from teamtr.tasks._text import check_knobs, instance_id, seeded_rng

Knobs = TypeVar("Knobs")


class KnobbedFamily(Generic[Knobs]):
    """Base of a family whose difficulty is a frozen dataclass of knobs (`knobs_type`).

    `Family(**defaults)` sets the defaults (a misspelt name is a TypeError, a bad value the knobs'
    own ValueError); `generate(n, seed, **difficulty)` starts with `self.knobs(difficulty)` and draws
    instance i from `self.instance_rng(seed, knobs, i)`, so instance i does not depend on n.
    """

    name: ClassVar[str]
    knobs_type: ClassVar[type]

    def __init__(self, **defaults: Any) -> None:
        self.defaults: Knobs = self.knobs_type(**defaults)

    def knobs(self, difficulty: dict[str, Any]) -> Knobs:
        """The defaults overridden by one call's knobs; an unknown knob is a clear error."""
        check_knobs(self.name, difficulty, {f.name for f in dataclasses.fields(self.knobs_type)})
        return dataclasses.replace(self.defaults, **difficulty)

    def instance_rng(self, seed: int | str, knobs: Knobs, index: int) -> random.Random:
        return seeded_rng(self.name, seed, knobs, index)

    def instance_id(self, seed: int | str, knobs: Knobs, index: int) -> str:
        return instance_id(self.name, seed, index, knobs)
