"""The shipped warm models (training/warmstart/shipped.py): the demo's config gets the weights shipped in
the package, checked against their sha256, instead of a build (whose last bits depend on the CPU's code
path); a build of a shipped config that gives other weights says that its figures will differ; every
build report records the CPU capability and the library versions."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch

from teamtr.training.demo import DEMO_CONFIG
from teamtr.training.warmstart import (
    build_warm_model,
    ensure_warm_model,
    is_complete,
    load_report,
    warm_config_for,
)
from teamtr.training.warmstart import shipped as shipped_module
from teamtr.training.warmstart.shipped import (
    DEMO_WARM_OVERRIDES,
    MANIFEST,
    SHIPPED_DIR,
    ShippedModelError,
    ship_folder,
    weights_digest,
)
from tests.support.warmstart import tiny_config


def test_the_demo_config_gets_the_shipped_model_checked_by_its_digest(tmp_path, monkeypatch):
    monkeypatch.setenv("TEAMTR_CACHE", str(tmp_path / "cache"))
    assert DEMO_CONFIG["team"]["warm_start"] == DEMO_WARM_OVERRIDES  # the demo's warm start is the shipped one
    cfg = warm_config_for("chain", **DEMO_WARM_OVERRIDES)
    path = ensure_warm_model(cfg, progress=False)
    assert path == SHIPPED_DIR / "chain-demo" and is_complete(path)
    entry = json.loads(MANIFEST.read_text())["models"]["chain-demo"]
    assert weights_digest(path) == entry["weights_sha256"] and entry["cache_key"] == cfg.cache_key()
    assert load_report(path).environment["cpu_capability"]  # where the shipped weights were built
    assert not (tmp_path / "cache").exists()  # nothing was built

    # a damaged install is refused, not trained from
    copy = tmp_path / "shipped"
    shutil.copytree(SHIPPED_DIR, copy)
    monkeypatch.setattr(shipped_module, "SHIPPED_DIR", copy)
    monkeypatch.setattr(shipped_module, "MANIFEST", copy / "shipped.json")
    weights = copy / "chain-demo" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ShippedModelError, match="does not match its sha256"):
        ensure_warm_model(cfg, progress=False)


def test_a_build_of_a_shipped_config_with_other_weights_warns(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TEAMTR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(shipped_module, "SHIPPED_DIR", tmp_path / "shipped")
    monkeypatch.setattr(shipped_module, "MANIFEST", tmp_path / "shipped" / "shipped.json")
    cfg = tiny_config(max_steps=2)
    report = build_warm_model(cfg, tmp_path / "build", progress=False)
    assert report.environment["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert report.environment["torch"] == torch.__version__ and "transformers" in report.environment
    assert report.differs_from_shipped is None  # nothing shipped for this config yet

    entry = ship_folder(tmp_path / "build", "tiny")
    assert entry["weights_sha256"] == weights_digest(tmp_path / "build")
    assert ensure_warm_model(cfg, progress=False) == tmp_path / "shipped" / "tiny"  # shipped: no build
    assert not (tmp_path / "cache").exists()

    # the same config built again on this machine: the same weights, no warning
    again = ensure_warm_model(cfg, progress=False, build=True)
    assert again.parent == tmp_path / "cache" / "models" and load_report(again).differs_from_shipped is None

    # as if the shipped model came from another machine's build: this build's figures will differ
    manifest = json.loads((tmp_path / "shipped" / "shipped.json").read_text())
    manifest["models"]["tiny"]["weights_sha256"] = "0" * 64
    (tmp_path / "shipped" / "shipped.json").write_text(json.dumps(manifest))
    with caplog.at_level(logging.WARNING):
        other = build_warm_model(cfg, tmp_path / "build2", progress=False)
    assert "figures made from this build will differ" in (other.differs_from_shipped or "")
    assert "figures made from this build will differ" in caplog.text
    assert load_report(tmp_path / "build2").differs_from_shipped == other.differs_from_shipped
    assert is_complete(tmp_path / "build2")  # the rewritten report keeps the build complete
