"""One import namespace: the wheel installs only `teamtr/...`, with every subpackage of the repo."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
AREAS = ("graphs", "training", "serving", "evals")


def test_wheel_has_one_namespace_and_every_subpackage(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("teamtr-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"teamtr", wheel.name.split("-py")[0] + ".dist-info"}
    packaged = {str(Path(n).parent) for n in names if n.endswith("__init__.py")}
    in_repo = {
        "teamtr/" + str(p.parent.relative_to(REPO))
        for area in AREAS
        for p in (REPO / area).rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    assert in_repo <= packaged, f"subpackages missing from pyproject's packages: {sorted(in_repo - packaged)}"
    # the shipped warm models travel with the package (training/warmstart/shipped.py)
    shipped = REPO / "training" / "warmstart" / "shipped"
    expected = {"teamtr/" + str(p.relative_to(REPO)) for p in shipped.rglob("*") if p.is_file()}
    assert any(n.endswith("model.safetensors") for n in expected)
    assert expected <= set(names), f"shipped files missing from the wheel: {sorted(expected - set(names))}"
    entry_points = (
        zipfile.ZipFile(wheel).read(f"{wheel.name.split('-py')[0]}.dist-info/entry_points.txt").decode()
    )
    assert "teamtr = teamtr.cli.main:app" in entry_points
