"""Task families. `get_task(name)` returns one; `TASKS` lists the names."""

from __future__ import annotations

from teamtr.evals.task import TaskFamily
from teamtr.evals.tasks.chain import ChainArithmetic

_FAMILIES: dict[str, type] = {
    ChainArithmetic.name: ChainArithmetic,
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
