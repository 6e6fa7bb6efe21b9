"""`teamtr serve`, `teamtr adapters push|rollback|list`, `teamtr traces to-trajectories`.

`serve RUN_DIR` serves the team a training run trained, read by training/run_dir.py `RunDir` as every
command reads a run; `serve CONFIG.yaml` takes a `ServeConfig` (several teams, keys, tracing). What is
served and how the server is assembled (`ServeConfig`, `build_server`) is cli/server.py; this module
holds the commands only.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from teamtr.cli.server import ServeConfig, build_server
from teamtr.serving.admin_client import (
    DEFAULT_URL,
    AdminClient,
    AdminRequestError,
    ServerUnreachableError,
)
from teamtr.serving.tracing import trajectories_from_store
from teamtr.training.run_dir import RunDir

console = Console(stderr=True)

# ---- commands ---------------------------------------------------------------------------------------

app = typer.Typer(no_args_is_help=True)
adapters_app = typer.Typer(
    help="Promote, roll back and list adapter versions of a running server.", no_args_is_help=True
)
traces_app = typer.Typer(help="Stored traces -> training trajectories.", no_args_is_help=True)
app.add_typer(adapters_app, name="adapters")
app.add_typer(traces_app, name="traces")


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
) -> None:
    """Serve a team as an OpenAI-compatible chat API (model = team name)."""
    overrides: dict[str, Any] = {}
    for key, value in {
        "engine": engine,
        "vllm_url": vllm_url,
        "host": host,
        "port": port,
        "admin_key": admin_key,
        "device": device,
        "dtype": dtype,
    }.items():
        if value is not None:
            overrides[key] = value
    keys = list(api_key or []) + [k for k in os.environ.get("TEAMTR_API_KEYS", "").split(",") if k]
    if keys:
        overrides["api_keys"] = keys
    if vllm_url and not engine:
        overrides["engine"] = "vllm"
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
    asyncio.run(_serve_forever(config))


async def _serve_forever(config: ServeConfig) -> None:
    import uvicorn

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
    # on SIGTERM uvicorn stops accepting, lets requests in flight finish for drain_timeout_s, then cancels them
    drain = config.drain_timeout_s
    uv = uvicorn.Config(server.app, host=config.host, port=config.port, timeout_graceful_shutdown=drain)
    await uvicorn.Server(uv).serve()


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
    path = path.resolve()
    run_root = path if (path / "config.yaml").is_file() else path.parent.parent.parent
    if (run_root / "config.yaml").is_file() and (path == run_root or path.parent.parent.name == "adapters"):
        run = RunDir(run_root)  # a run's version directory: the role's adapter name is the run's
        adapter = run.role(role).adapter or role
        if path == run_root:
            version_found, path = run.latest_adapters(roles=[run.role(role)])[adapter]
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


@adapters_app.command("list")
def adapters_list(url: str = _URL, admin_key: str = _KEY) -> None:
    """Every adapter version the server knows, which is live, and how many episodes use each."""
    with _admin_errors():
        listed = AdminClient(url, admin_key).list_versions()
    table = Table("adapter", "version", "current", "loaded", "in flight", "lineage", "path")
    for role, versions in listed.roles.items():
        for v in versions:
            table.add_row(
                role,
                str(v.version),
                "*" if v.current else ("candidate" if v.candidate else ""),
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


def lineage_text(lineage: dict[str, Any]) -> str:
    """Where a version came from (which improve run, data window, incumbent), as one short line."""
    keys = ("run", "data_window", "incumbent")
    return "; ".join(f"{k}={lineage[k]}" for k in keys if k in lineage)


@traces_app.command("to-trajectories")
def traces_to_trajectories(
    db: Path = typer.Argument(..., help="the SQLite span store (traces.db)"),
    out: Path = typer.Option(..., "--out", help="JSONL of Trajectory records, as training reads them"),
    require_reward: bool = typer.Option(False, help="only episodes whose conversation got feedback"),
    group_by_prompt: bool = typer.Option(
        False, help="episodes of the same prompt share a group id (non-zero group-normalised advantages)"
    ),
) -> None:
    """Stored spans + feedback rewards -> the Trajectory objects training consumes."""
    from teamtr.graphs.trajectory import save_jsonl

    if not db.is_file():
        raise typer.BadParameter(f"no span store at {db}")
    trajectories = trajectories_from_store(db, require_reward, group_by_prompt)
    save_jsonl(trajectories, out)
    console.print(f"{len(trajectories)} trajectories -> {out}")
