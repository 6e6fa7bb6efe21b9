"""Task families. `get_task(name)` returns one; `task_names()` lists the names.

A family is one module, tasks/<family>.py: its class generates and verifies instances and declares its
default team's system prompt, message budget and warm-start settings (tasks/family_settings.py). Adding a
family is that module and one line in `_BUILT_IN` below.
"""

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

_BUILT_IN: tuple[type, ...] = (
    ChainArithmetic,
    ConventionChain,
    Countdown,
    Zebra,
    Autologi,
    Blocksworld,
    Arbench,
    Split,
    BlindRelay,
)
# the registry: family name -> its class
_FAMILIES: dict[str, type] = {cls.name: cls for cls in _BUILT_IN}


def register(cls: type) -> type:
    """Class decorator / call to add a task family under its `name`."""
    _FAMILIES[cls.name] = cls
    return cls


def task_names() -> list[str]:
    return sorted(_FAMILIES)


def family_class(name: str) -> type | None:
    """The class registered as `name` (its declarations, without building one); None for other names (a
    real benchmark's, a run's own task list)."""
    return _FAMILIES.get(name)


def get_task(name: str, **options) -> TaskFamily:
    try:
        return _FAMILIES[name](**options)
    except KeyError:
        raise KeyError(f"unknown task {name!r}; known: {', '.join(task_names())}") from None
