"""Where a pushed adapter may come from: the adapter roots of a server (ServeConfig `adapter_roots`).

With roots, a path given to `POST /admin/adapters` or `POST /admin/candidate` is resolved against the
first root (not the server's working directory), symlinks and `..` followed, and refused unless it lies
inside one of the roots; the refusal does not say whether the path exists, and the registry's own
errors about a path inside a root name it relative to that root, so answers reveal nothing of the file
system outside them. Without roots (the default outside the production preset) a path is taken as it
is, relative to the working directory, as before.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


class AdapterRoots:
    def __init__(self, roots: Sequence[str | Path] | None) -> None:
        self.roots = None if roots is None else [Path(r).resolve() for r in roots]
        if self.roots == []:
            raise ValueError("adapter_roots is empty: name at least one directory, or leave it unset")

    def resolve(self, path: str) -> Path:
        """The directory a pushed `path` names (ValueError, naming nothing, if it is outside the roots)."""
        if self.roots is None:
            return Path(path)
        if "\x00" in path:
            raise ValueError("an adapter path must not contain NUL bytes")
        given = Path(path)
        resolved = (given if given.is_absolute() else self.roots[0] / given).resolve()
        if not any(resolved.is_relative_to(root) for root in self.roots):
            raise ValueError(
                "the adapter path is outside this server's adapter roots (ServeConfig adapter_roots); "
                "give a directory under one of them (a relative path is relative to the first)"
            )
        return resolved

    def hide(self, message: str) -> str:
        """A registry error with the roots' own location left out (paths relative to their root)."""
        for root in self.roots or ():
            message = message.replace(f"{root}{os.sep}", "").replace(str(root), ".")
        return message
