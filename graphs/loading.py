"""The one loader of the `module:attribute` names a config gives (team.roles, team.router, team.graph,
team.input / output / reward, task.data, a served team's roles).

`teamtr` is a console script, so the working directory, where `python -m` would look first, is not on
sys.path: a module beside the user's config (`mine.routers:r`) is searched for there too.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any


class ConfigObjectError(ValueError):
    """A config's `module:attribute` cannot be loaded or is not what it must be (the message names the key)."""


def import_module(name: str) -> Any:
    """`importlib.import_module`, with the working directory searched when the module is not found."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        if os.getcwd() in sys.path:
            raise
        sys.path.insert(0, os.getcwd())
        return importlib.import_module(name)


def load_object(spec: str, key: str) -> Any:
    """The object a config names as `module:attribute` (ConfigObjectError naming `key` otherwise)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigObjectError(f"{key} {spec!r}: expected 'module:attribute'")
    try:
        obj = import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise ConfigObjectError(f"{key} {spec!r}: {e}") from None
    return obj


def load_function(spec: str | None, key: str, default: Callable[..., Any] | None = None) -> Any:
    """A callable a config names, or `default` when it names none."""
    if spec is None:
        return default
    fn = load_object(spec, key)
    if not callable(fn):
        raise ConfigObjectError(f"{key} {spec!r} is a {type(fn).__name__}, not a function")
    return fn
