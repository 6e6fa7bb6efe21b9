"""Task families. `get_task(name)` returns one; `TASKS` lists the names."""

from __future__ import annotations

from teamtr.graphs.task import TaskFamily
from teamtr.tasks.arbench import Arbench
from teamtr.tasks.autologi import Autologi
from teamtr.tasks.blocksworld import Blocksworld
from teamtr.tasks.chain import ChainArithmetic
from teamtr.tasks.convention import ConventionChain
from teamtr.tasks.countdown import Countdown
from teamtr.tasks.relay import BlindRelay
from teamtr.tasks.split import Split
from teamtr.tasks.zebra import Zebra

_FAMILIES: dict[str, type] = {
    ChainArithmetic.name: ChainArithmetic,
    ConventionChain.name: ConventionChain,
    Countdown.name: Countdown,
    Zebra.name: Zebra,
    Autologi.name: Autologi,
    Blocksworld.name: Blocksworld,
    Arbench.name: Arbench,
    Split.name: Split,
    BlindRelay.name: BlindRelay,
}


def register(cls: type) -> type:
    """Class decorator / call to add a task family under its `name`."""
    _FAMILIES[cls.name] = cls
    return cls


def task_names() -> list[str]:
    return sorted(_FAMILIES)


def get_task(name: str, **options) -> TaskFamily:
    try:
        return _FAMILIES[name](**options)
    except KeyError:
        raise KeyError(f"unknown task {name!r}; known: {', '.join(task_names())}") from None
