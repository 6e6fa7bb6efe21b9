"""graphs/loading.py, the one loader of a config's `module:attr` names: a module beside the user's config
(the working directory, which a console script does not put on sys.path) is found for every key that
names one: team.router, team.graph, team.roles, team.reward, task.data."""

from __future__ import annotations

import sys
import textwrap

import pytest

from teamtr.graphs.loading import ConfigObjectError, load_function, load_object
from teamtr.graphs.roles import Role
from teamtr.graphs.spec import TaskConfig, TeamConfig, roles_from_factory, team_options, team_roles
from teamtr.graphs.team import TeamError, load_router
from teamtr.graphs.user_graph import data_family

MODULE = """
    from typing import Literal
    from teamtr.graphs.roles import Role
    from teamtr.graphs.task import TaskInstance

    def roles():
        return [Role("a", "Say a.", adapter="a"), Role("b", "Say b.", adapter="b")]

    def router(state) -> Literal["a", "b", "__end__"]:
        return "__end__"

    def build(models):
        return models

    def reward(task, state):
        return 1.0

    def tasks():
        return [TaskInstance(id="t1", prompt="1+2", answer="3")]
"""


@pytest.fixture
def beside_the_config(tmp_path, monkeypatch):
    """A module `mine_cfg` in the working directory, which is not on sys.path."""
    (tmp_path / "mine_cfg.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "mine_cfg", raising=False)
    yield "mine_cfg"
    sys.modules.pop("mine_cfg", None)


def test_every_key_finds_a_module_in_the_working_directory(beside_the_config):
    module = beside_the_config
    assert callable(load_router(f"{module}:router"))
    assert "router" in team_options(TeamConfig(router=f"{module}:router"))
    assert [r.name for r in roles_from_factory(f"{module}:roles")] == ["a", "b"]
    team = TeamConfig(roles=f"{module}:roles")
    assert all(isinstance(r, Role) for r in team_roles(team, TaskConfig(), lambda *a, **k: []))
    assert callable(load_object(f"{module}:build", "team.graph"))
    assert load_function(f"{module}:reward", "team.reward")(None, None) == 1.0
    family = data_family(f"{module}:tasks", "mine")
    assert [t.prompt for t in family.generate(1, seed=0)] == ["1+2"]


def test_what_cannot_be_loaded_is_one_error_naming_the_key(beside_the_config):
    with pytest.raises(ConfigObjectError, match=r"team.graph 'nomodule_xyz:build': No module named 'nomodule_xyz'"):
        load_object("nomodule_xyz:build", "team.graph")
    with pytest.raises(ConfigObjectError, match=r"team.reward 'mine_cfg:nothing'"):
        load_function("mine_cfg:nothing", "team.reward")
    with pytest.raises(ConfigObjectError, match="expected 'module:attribute'"):
        load_object("mine_cfg", "team.roles")
    with pytest.raises(TeamError, match="cannot import module 'nomodule_xyz'"):
        load_router("nomodule_xyz:r")
