"""The README's flows, in its order, on a demo-sized model with tiny settings (real processes, real
server, real clients):

    teamtr demo --out DIR                    (with --config: a random demo-sized model, two short stages)
    teamtr serve DIR/run --port P            in its own process; the openai client and ChatOpenAI ask it
    teamtr adapters push --role adder1 DIR/run/adapters/adder1/v<N+1>   answers then name v<N+1>
    teamtr eval DIR/run --task chain ...     (also --baseline best-of-n)
    teamtr report, teamtr swap, teamtr train SWAPPED/config.yaml, teamtr demo --compare, the examples' configs

and the errors a user meets first: a wrong path, a run without adapters, a config from another version
are one line of error, never a traceback (`teamtr --debug` shows it).

The run written by `teamtr demo` has `team.roles: null` (the task's own team), as `make demo`'s has.
The benchmark commands are in tests/project/test_readme_benchmarks.py, `--engine vllm` in
tests/project/test_readme_flows_vllm.py; the other README commands have their own tests (`eval --list-tasks`,
`eval warm`, `warmstart`: test_cli.py / test_warmstart_families.py; `theory check|scaling`:
test_cli.py; `traces to-trajectories`: test_tracing.py).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import yaml
from langchain_openai import ChatOpenAI
from typer.testing import CliRunner

from teamtr.cli.main import app
from teamtr.training.run_dir import RunDir
from tests.support.serve_process import serve_process

pytestmark = pytest.mark.slow

ADMIN_KEY = "adm-readme"
TASK = "3+7+9+5"
# tiny settings: the flow, not the learning, is under test
TINY = {
    "stages": 2,
    "rollout": {"prompts_per_update": 2, "group_size": 2, "temperature": 1.0},
    "optim": {"lr": 3e-3, "epochs": 1, "minibatch_messages": 8},
    "trust_region": {"delta": 0.05, "probe_episodes": 4, "heldout_episodes": 2},  # test-sized checks
    "eval": {"stage_episodes": 2, "final_episodes": 4, "temperature": 0.0},
}
runner = CliRunner()


def teamtr(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The real `teamtr` command in its own process."""
    return subprocess.run(
        [sys.executable, "-m", "teamtr.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


def invoke(*args: str, env: dict[str, str] | None = None) -> str:
    result = runner.invoke(app, list(args), env=env)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory) -> Path:
    """A random model of the demo's size (hidden 128, 4 layers, 4 heads) with the character tokenizer."""
    from teamtr.training.tiny_models import build_char_tokenizer
    from teamtr.training.warmstart import WarmStartConfig, new_model, save_model

    ws = WarmStartConfig()
    tokenizer = build_char_tokenizer()
    out = tmp_path_factory.mktemp("demo-model")
    save_model(new_model(tokenizer, ws.hidden, ws.layers, ws.heads, seed=0), tokenizer, out)
    return out


@pytest.fixture(scope="module")
def tiny_config(demo_model, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("configs") / "tiny.yaml"
    path.write_text(yaml.safe_dump({**TINY, "team": {"model": str(demo_model)}}))  # roles: the task's own
    return path


@pytest.fixture(scope="module")
def demo_dir(tiny_config, tmp_path_factory) -> Path:
    """`teamtr demo` (README Quickstart) with the tiny config."""
    out = tmp_path_factory.mktemp("demo")
    invoke("demo", "--out", str(out), "--config", str(tiny_config))
    assert yaml.safe_load((out / "run" / "config.yaml").read_text())["team"]["roles"] is None
    return out


@pytest.fixture(scope="module")
def served(demo_dir) -> Iterator[str]:
    """`teamtr serve runs/demo/run --port 8000` in its own process."""
    with serve_process(str(demo_dir / "run"), env={"TEAMTR_ADMIN_KEY": ADMIN_KEY}) as url:
        yield url


def newest_version(run: Path, adapter: str) -> int:
    return max(int(p.name[1:]) for p in (run / "adapters" / adapter).glob("v*"))


def test_the_demo_run_is_served_and_hot_swapped(demo_dir, served):
    run = demo_dir / "run"
    summary = json.loads((demo_dir / "summary.json").read_text())
    assert summary["episodes_evaluated"] == TINY["eval"]["final_episodes"]
    newest = {a: newest_version(run, a) for a in ("adder1", "adder2", "adder3")}

    # the README's openai snippet: `model` is the team's name (the run directory's name)
    client = openai.OpenAI(base_url=served + "/v1", api_key="...", max_retries=0)
    reply = client.chat.completions.create(model="run", messages=[{"role": "user", "content": TASK}])
    extension = reply.model_extra["teamtr"]
    assert [t["role"] for t in extension["turns"]] == ["adder1", "adder2", "adder3"]
    assert extension["adapter_versions"] == newest  # each role's newest saved version is live

    chat = ChatOpenAI(base_url=served + "/v1", api_key="...", model="run", max_retries=0, temperature=0)
    answer = chat.invoke(TASK)
    assert isinstance(answer.content, str)
    assert answer.content == reply.choices[0].message.content  # greedy roles: the same answer

    # a newer version of adder1 (what one more accepted update writes), promoted with the README command
    pushed = newest["adder1"] + 1
    new_dir = run / "adapters" / "adder1" / f"v{pushed}"
    shutil.copytree(run / "adapters" / "adder1" / f"v{newest['adder1']}", new_dir)
    result = teamtr("adapters", "push", "--role", "adder1", str(new_dir), env={"TEAMTR_URL": served,
                                                                           "TEAMTR_ADMIN_KEY": ADMIN_KEY})  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"v{pushed} is live" in result.stdout + result.stderr
    after = client.chat.completions.create(model="run", messages=[{"role": "user", "content": TASK}])
    versions = after.model_extra["teamtr"]["adapter_versions"]
    assert versions == {**newest, "adder1": pushed}
    assert [t["adapter_version"] for t in after.model_extra["teamtr"]["turns"]][0] == pushed
    shutil.rmtree(new_dir)


def test_eval_report_and_swap_read_the_demo_run(demo_dir, demo_model, tmp_path):
    run = demo_dir / "run"
    out = invoke("eval", str(run), "--task", "chain", "-k", "2", "--limit", "3", "--json", "--out",
                 str(tmp_path / "eval"))  # fmt: skip
    result = json.loads(out[out.index("{") :])
    assert result["task"] == "chain" and result["instances"] == 3 and result["episodes"] == 6
    # best-of-n without -k would compare best-of-~1: refused, naming -k
    assert "-k" in one_line_error("eval", str(run), "--task", "chain", "--baseline", "best-of-n")

    # `teamtr swap RUN --role adder3 --model PATH --out NEW`, then `teamtr train NEW/config.yaml`
    newcomer = tmp_path / "newcomer"
    shutil.copytree(demo_model, newcomer)
    swapped = tmp_path / "swapped"
    invoke("swap", str(run), "--role", "adder3", "--model", str(newcomer), "--out", str(swapped),
           "--probes", "4", "--max-rounds", "1", "--extra-stages", "1", "--json")  # fmt: skip
    invoke("train", str(swapped / "config.yaml"))
    swapped_run = RunDir(swapped)
    assert swapped_run.roles[2].base_model != "base"
    assert set(swapped_run.saved_adapters()) == {"adder1", "adder2", "adder3"}
    out = invoke(
        "eval", str(swapped), "--task", "chain", "--limit", "2", "--json", "--out", str(tmp_path / "e2")
    )
    assert json.loads(out[out.index("{") :])["episodes"] == 2

    # `teamtr report RUN_A RUN_B`: plots overlaid
    invoke("report", str(run), str(swapped), "--out", str(tmp_path / "plots"))
    assert len(list((tmp_path / "plots").glob("*.png"))) == 4


def readme_commands(prefix: str) -> list[list[str]]:
    """The README's shell lines (in ```bash blocks) that start with `prefix`, comments cut, split as the
    shell splits them."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    lines = [line.split(" #")[0].strip() for block in re.findall(r"```bash\n(.*?)```", text, re.S)
             for line in block.splitlines()]  # fmt: skip
    return [shlex.split(line) for line in lines if line.startswith(prefix)]


def test_the_readmes_eval_commands_run_as_written(demo_dir, tmp_path):
    """Every `teamtr eval runs/demo/run ...` line of the README, on the tiny demo run: only the run's path,
    --limit (2 instances) and where the result goes change."""
    commands = readme_commands("teamtr eval runs/demo/run")
    assert len(commands) >= 2 and any("--baseline" in c for c in commands)
    for i, argv in enumerate(commands):
        args = [str(demo_dir / "run") if a == "runs/demo/run" else a for a in argv[1:]]
        if "--limit" in args:
            del args[args.index("--limit") : args.index("--limit") + 2]
        invoke(*args, "--limit", "2", "--out", str(tmp_path / str(i)))
        saved = json.loads((tmp_path / str(i) / "result.json").read_text())
        k = int(args[args.index("-k") + 1]) if "-k" in args else 1
        assert saved["episodes"] == 2 * k
        if "--baseline" in args:  # best-of-N at the tokens of k team episodes: more than one sample
            assert saved["baseline"]["n"] > 1
        assert (tmp_path / str(i) / "pass_at_k.png").exists()


def test_examples_train_and_demo_compare(demo_model, tiny_config, tmp_path):
    """`teamtr train examples/teamtr.yaml` / `examples/naive.yaml` (model and sizes overridden) and
    `teamtr demo --compare`."""
    root = Path(__file__).resolve().parents[2]
    sets = ["--set", f"team.model={demo_model}", "--set", "stages=1", "--set", "rollout.prompts_per_update=2",
            "--set", "rollout.group_size=2", "--set", "optim.epochs=1", "--set", "eval.stage_episodes=2",
            "--set", "trust_region.probe_episodes=4", "--set", "trust_region.heldout_episodes=2"]  # fmt: skip
    for name in ("teamtr", "naive"):
        out = invoke(
            "train", str(root / "examples" / f"{name}.yaml"), "--run-dir", str(tmp_path / name), *sets
        )
        assert "d_hat" in out
        assert RunDir(tmp_path / name).config.schedule.kind == name
    invoke("report", str(tmp_path / "teamtr"), str(tmp_path / "naive"), "--out", str(tmp_path / "plots"))
    invoke(
        "demo", "--compare", "--seeds", "1", "--out", str(tmp_path / "compare"), "--config", str(tiny_config)
    )
    compare = json.loads((tmp_path / "compare" / "compare.json").read_text())
    assert [r["seed"] for r in compare["per_seed"]] == [0]
    # every example config reads as a current config
    for path in sorted((root / "examples").glob("*.yaml")):
        from teamtr.training.run_dir import read_config

        read_config(path)


# ---- errors: one line, no traceback ------------------------------------------------------------------


def one_line_error(*args: str) -> str:
    """The error of `teamtr ARGS` (in process): one line, exit code != 0, no exception escaped."""
    result = runner.invoke(app, list(args))
    assert result.exit_code != 0 and isinstance(result.exception, SystemExit), result.exception
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_a_wrong_path_is_one_line_of_error(tmp_path):
    missing = str(tmp_path / "nope")
    assert "nope" in one_line_error("serve", missing)
    assert "nope" in one_line_error("eval", missing, "--task", "chain")
    assert "nope" in one_line_error("report", missing)
    assert "nope" in one_line_error("train", missing + ".yaml")
    (tmp_path / "empty").mkdir()
    assert "not a run directory" in one_line_error("serve", str(tmp_path / "empty"))
    assert "not a run directory" in one_line_error("swap", str(tmp_path / "empty"), "--role", "adder1",
                                                   "--model", str(tmp_path))  # fmt: skip
    assert "unknown task" in one_line_error("eval", str(tmp_path), "--task", "nope")
    # the real command: stderr is that one line; with --debug, the traceback instead
    real = teamtr("serve", str(tmp_path / "empty"))
    assert real.returncode == 1 and "Traceback" not in real.stderr
    assert [line for line in real.stderr.splitlines() if line.strip()] == [
        f"error: {tmp_path / 'empty'} is not a run directory (no config.yaml)"
    ]
    debug = teamtr("--debug", "serve", str(tmp_path / "empty"))
    assert (
        debug.returncode != 0 and "FileNotFoundError" in debug.stderr and len(debug.stderr.splitlines()) > 5
    )


def test_a_run_without_adapters_is_one_line_of_error(demo_model, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({**TINY, "team": {"model": str(demo_model)}}))
    for command in (("serve", str(run)), ("eval", str(run), "--task", "chain")):
        line = one_line_error(*command)
        assert "no saved adapters" in line and "adder1" in line


def test_a_config_from_another_version_is_one_line_naming_the_field(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"team": {"roles": None}, "loss": {"kind": "grpo",
                                                                                      "kl_coef": 0.1}}))  # fmt: skip
    for command in (
        ("serve", str(run)),
        ("eval", str(run), "--task", "chain"),
        ("train", str(run / "config.yaml")),
    ):
        line = one_line_error(*command)
        assert "config.yaml" in line and "loss.kl_coef" in line and "another version" in line
    (run / "config.yaml").write_text("team: [unclosed")
    assert "config.yaml" in one_line_error("serve", str(run))
