"""`teamtr serve`, `teamtr adapters push|rollback|list` (and `teamtr traces ...`, cli/traces.py).

`serve RUN_DIR` serves the team a training run trained; `serve CONFIG.yaml` takes a `ServeConfig` (several
teams, keys, tracing). What is served and how the server is assembled (`ServeConfig`, `build_server`) is
serving/server.py, which reads runs with nothing of training; this module holds the commands, and checks
a run's whole config (training's file) before it is served (`_check_runs`). Heavy imports (the
server, torch) wait for the command that needs them, so `teamtr --help` and a bad argument answer at once.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
import yaml
from rich.console import Console
from rich.table import Table

from teamtr.cli import traces
from teamtr.client.admin_client import (
    DEFAULT_URL,
    AdminClient,
    AdminRequestError,
    ServerUnreachableError,
)

if TYPE_CHECKING:
    from teamtr.serving.server import ServeConfig

console = Console(stderr=True)

# ---- commands ---------------------------------------------------------------------------------------

app = typer.Typer(no_args_is_help=True)
adapters_app = typer.Typer(
    help="Promote, roll back and list adapter versions of a running server.", no_args_is_help=True
)
app.add_typer(adapters_app, name="adapters")
app.add_typer(traces.app, name="traces")


@app.command()
def serve(
    source: Path = typer.Argument(..., help="a training run directory, or a serve config YAML"),
    engine: str = typer.Option(None, help="embedded | vllm (default: the config's, else embedded)"),
    vllm_url: str = typer.Option(None, help="attach to this running vLLM server instead of launching one"),
    host: str = typer.Option(None, help="bind address (default 127.0.0.1)"),
    port: int = typer.Option(None, help="port (default 8000)"),
    team_name: str = typer.Option(None, help="serve a run directory's team under this name"),
    stage: int = typer.Option(
        None,
        min=0,
        help="a run directory's adapters after this many stages (default: the newest; 0: the start)",
    ),
    api_key: list[str] = typer.Option(None, help="accepted chat API key (repeatable; env TEAMTR_API_KEYS)"),
    admin_key: str = typer.Option(None, envvar="TEAMTR_ADMIN_KEY", help="key of the /admin endpoints"),
    otlp_endpoint: str = typer.Option(
        None, help="also export spans by OTLP/HTTP, e.g. http://host:6006/v1/traces"
    ),
    device: str = typer.Option(
        None, help="embedded engine device: auto | cpu | cuda | cuda:K (default auto)"
    ),
    dtype: str = typer.Option(None, help="embedded engine dtype: auto | float32 | bfloat16 | float16"),
    db: str = typer.Option(
        None,
        envvar="TEAMTR_DB",
        help="postgresql://... : the store several replicas share (conversations, spans, promotions); "
        "default: SQLite and JSONL files beside the run (one server). docs/scale.md",
    ),
) -> None:
    """Serve a team as an OpenAI-compatible chat API (model = team name)."""
    from teamtr.serving.server import ServeConfig

    overrides: dict[str, Any] = {}
    for key, value in {
        "engine": engine,
        "vllm_url": vllm_url,
        "host": host,
        "port": port,
        "admin_key": admin_key,
        "device": device,
        "dtype": dtype,
        "db": db,
    }.items():
        if value is not None:
            overrides[key] = value
    keys = list(api_key or []) + [k for k in os.environ.get("TEAMTR_API_KEYS", "").split(",") if k]
    if keys:
        overrides["api_keys"] = keys
    if vllm_url and not engine:
        overrides["engine"] = "vllm"
    _check_runs(source)
    if source.is_dir():
        config = ServeConfig.from_run_dir(source, team_name, stage, **overrides)
    elif stage is not None:
        raise typer.BadParameter("--stage needs a run directory (a serve config gives `stage:` per team)")
    elif source.is_file():
        config = ServeConfig.from_yaml(source, **overrides)
    else:
        raise typer.BadParameter(f"{source} is neither a run directory nor a config file")
    if otlp_endpoint:
        config.tracing.otlp_endpoint = otlp_endpoint
    if config.model is None and not any(t.run_dir for t in config.teams.values()):
        from teamtr.training.warmstart import ensure_warm_model

        config.model = str(ensure_warm_model())  # the demo team's model, built once
    asyncio.run(_serve_forever(config))


def _check_runs(source: Path) -> None:
    """Before a run is served: its whole config is valid (one line naming the field otherwise), and a run
    from before base models were recorded gets them recorded (its warm model found or built once)."""
    from teamtr.graphs.run_layout import CONFIG_FILE
    from teamtr.serving.server import is_train_config
    from teamtr.training.run_dir import RunDir, read_config

    if source.is_file():
        data = yaml.safe_load(source.read_text()) or {}
        if not (isinstance(data, dict) and is_train_config(data)):
            return
        source = Path(read_config(source).run_dir)
        if not source.is_dir():
            return  # ServeConfig.from_yaml says: train it first
    if (source / CONFIG_FILE).is_file():
        run = RunDir(source)
        run.base_paths()  # records base_models.json where the run has none
        warn_changed_code(source, run.config.team)


def warn_changed_code(source: Path, team_cfg: Any) -> list[str]:
    """Warn (one line per module) when the graph code a run names differs from the code it trained with
    (RUN_DIR/code_digest.json, graphs/code_digest.py): its adapters learnt the old prompts. The lines."""
    from teamtr.graphs.code_digest import changed_code

    lines = changed_code(source, team_cfg)
    for line in lines:
        console.print(
            f"[bold yellow]warning: {source}: {line}[/]: the run's adapters were trained with the old code; "
            "serving it as it is now (retrain, or restore the module, to serve what was trained)"
        )
    return lines


async def _serve_forever(config: ServeConfig) -> None:
    import uvicorn

    from teamtr.serving.server import build_server

    server = await build_server(config)  # built on the loop uvicorn then serves on (engine tasks, locks)

    @asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        # shut down here, not after serve(): uvicorn re-raises SIGTERM / SIGINT once serve() returns
        yield
        await server.aclose()

    server.app.router.lifespan_context = lifespan
    console.print(
        f"serving teams {sorted(server.teams)} on http://{config.host}:{config.port} "
        f"({config.engine} engine); adapters {server.registry.current_versions()}"
    )
    console.print(stores_line(config))
    console.print(base_models_line(server.base_models))
    # on SIGTERM uvicorn stops accepting, lets requests in flight finish for drain_timeout_s, then cancels them
    drain = config.drain_timeout_s
    uv = uvicorn.Config(
        server.app,
        host=config.host,
        port=config.port,
        timeout_graceful_shutdown=drain,
        timeout_keep_alive=config.keep_alive_s,
    )
    await uvicorn.Server(uv).serve()


def stores_line(config: ServeConfig) -> str:
    """Where the served episodes go: the span store and the conversation store, as absolute paths."""
    t = config.tracing
    spans = str(config.path(t.sqlite_path).resolve()) if t.sqlite_path else "off"
    if t.otlp_endpoint:
        spans += f" (and OTLP {t.otlp_endpoint})"
    threads = (
        str(config.path(config.conversations_path).resolve()) if config.conversations_path else "in memory"
    )
    return f"traces: {spans} (teamtr traces list ...); conversations: {threads}"


def base_models_line(bases: dict[str, str]) -> str:
    """The base models served, by base name: `smollm2 (SmolLM2-135M-Instruct.Q4_1.gguf) at FOLDER`."""
    from teamtr.engines.models import model_label

    return "base models: " + "; ".join(f"{name} = {model_label(path)}" for name, path in bases.items())


@contextmanager
def _admin_errors() -> Iterator[None]:
    """The admin client's failures as one line: unreachable is a bad --url, an error answer exits 1."""
    try:
        yield
    except ServerUnreachableError as e:
        raise typer.BadParameter(str(e)) from None
    except AdminRequestError as e:
        console.print(f"[red]{e.status}: {e.message}")
        raise typer.Exit(1) from None


_URL = typer.Option(DEFAULT_URL, envvar="TEAMTR_URL", help="the running server")
_KEY = typer.Option(None, envvar="TEAMTR_ADMIN_KEY", help="the server's admin key")


@adapters_app.command("push")
def adapters_push(
    path: Path = typer.Argument(
        ..., help="a peft adapter directory, or a run directory (its newest version)"
    ),
    role: str = typer.Option(..., help="the role (or its adapter's name) to promote a version of"),
    version: int = typer.Option(None, help="version number (default: from a v<N> directory, or next)"),
    url: str = _URL,
    admin_key: str = _KEY,
) -> None:
    """Validate and promote a new adapter version on a running server (the old one keeps serving if refused)."""
    from teamtr.graphs.run_layout import CONFIG_FILE, run_of_version_dir
    from teamtr.serving.server import open_run

    path = path.resolve()
    found = (path, None) if (path / CONFIG_FILE).is_file() else run_of_version_dir(path)
    if found is not None:
        run_root = found[0]
        run = open_run(run_root)  # a run's version directory: the role's adapter name is the run's
        adapter = run.role(role).adapter or role
        if path == run_root:
            version_found, path = run.saved_adapters(roles=[run.role(role)])[adapter]
            version = version or version_found
        role = adapter
    if not path.is_dir():
        raise FileNotFoundError(
            f"{path} is not a directory (want a peft adapter directory or a run directory)"
        )
    with _admin_errors():
        info = AdminClient(url, admin_key).push(role, path, version)
    console.print(f"{role}: v{info.version} is live ({info.engine_name})")


@adapters_app.command("rollback")
def adapters_rollback(role: str = typer.Option(...), url: str = _URL, admin_key: str = _KEY) -> None:
    """Serve the previously promoted version of a role's adapter again."""
    with _admin_errors():
        info = AdminClient(url, admin_key).rollback(role)
    console.print(f"{role}: back on v{info.version}")


@adapters_app.command("restore")
def adapters_restore(
    team: int = typer.Option(..., min=0, help="the promoted team's number in `teamtr adapters list`"),
    url: str = _URL,
    admin_key: str = _KEY,
) -> None:
    """Serve an earlier promoted team again, every role at once (recorded in the promotion log)."""
    with _admin_errors():
        decision = AdminClient(url, admin_key).restore_team(team)
    console.print(f"team {team} serves: {decision.current}")


@adapters_app.command("list")
def adapters_list(url: str = _URL, admin_key: str = _KEY) -> None:
    """Every adapter version the server knows: its state (serving, candidate, promoted, rolled back,
    abandoned), whether it is loaded, its episodes in flight and lineage; then the promoted teams."""
    with _admin_errors():
        listed = AdminClient(url, admin_key).list_versions()
    share = listed.candidate.share if listed.candidate is not None else 0.0
    table = Table("adapter", "version", "state", "loaded", "in flight", "lineage", "path")
    for role, versions in listed.roles.items():
        for v in versions:
            table.add_row(
                role,
                str(v.version),
                f"candidate (canary share {share:g})"
                if v.state == "candidate"
                else v.state.replace("_", " "),
                "yes" if v.live else "no",
                str(v.in_flight),
                lineage_text(v.lineage),
                v.path,
            )
    out = Console()
    out.print(table)
    c = listed.candidate
    if c is not None:
        versions = ", ".join(f"{a} v{c.incumbent[a]} -> v{v}" for a, v in sorted(c.versions.items()))
        out.print(
            f"candidate: {versions}; canary share {c.share:g} ({c.canary_episodes} of {c.episodes} episodes "
            f"since set, {c.total_canary_episodes} in all); {lineage_text(c.lineage)}"
        )
    for i, team in enumerate(listed.teams):  # what `teamtr adapters restore --team I` serves again
        now = " (serving)" if {a: listed.current.get(a) for a in team} == team else ""
        out.print(f"promoted team {i}: " + ", ".join(f"{a} v{v}" for a, v in sorted(team.items())) + now)


def lineage_text(lineage: dict[str, Any]) -> str:
    """Where a version came from (which improve run, data window, incumbent), as one short line."""
    keys = ("run", "data_window", "incumbent", "attempt_id")
    return "; ".join(f"{k}={lineage[k]}" for k in keys if k in lineage)
