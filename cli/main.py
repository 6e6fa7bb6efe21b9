"""The root `teamtr` command: each area's commands come from a module of this package.

Errors are handled here once for every command: a user mistake (a wrong path, a run without adapters,
a bad or old config, an unknown task: ValueError and OSError, training/run_dir.py's RunDirError among
them, and typer.BadParameter) prints one line `error: ...` and exits non-zero; any other exception
prints one line naming its type.
`teamtr --debug COMMAND ...` shows the full (rich) traceback instead.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup

from teamtr.cli import eval as eval_cli
from teamtr.cli import improve, models, serve, swap, theory, train, warmstart


class OneLineErrors(TyperGroup):
    """The root group: runs the chosen command and turns what it raises into one line of error."""

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except typer.BadParameter as e:  # a bad value (path, task, knob): one line, without the usage box
            if ctx.params.get("debug"):
                raise
            typer.echo(f"error: {' '.join(e.format_message().split())}", err=True)
            raise typer.Exit(e.exit_code) from None
        except (typer.TyperException, typer.Exit, typer.Abort):
            raise  # other usage errors, help and exits: typer prints them itself
        except Exception as e:
            if ctx.params.get("debug"):
                raise
            message = " ".join(str(e).split()) or type(e).__name__
            # a failed episode's notes say in which graph, node and task (graphs/capture.py)
            message = "; ".join([message, *(n for n in getattr(e, "__notes__", ()) if isinstance(n, str))])
            if not isinstance(e, ValueError | OSError):  # not a user mistake we know: say what it was
                message = f"{type(e).__name__}: {message} (rerun with `teamtr --debug ...` for the traceback)"
            typer.echo(f"error: {message}", err=True)
            raise typer.Exit(1) from None


app = typer.Typer(
    name="teamtr",
    help="Write a team of LLM role agents as a LangGraph graph, train it with TeamTR, serve it.",
    no_args_is_help=True,
    cls=OneLineErrors,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def root(
    debug: bool = typer.Option(False, "--debug", help="show the full traceback of an error"),
) -> None:
    """Write a team of LLM role agents as a LangGraph graph, train it with TeamTR, serve it."""


for part in (train.app, swap.app, eval_cli.app, serve.app, improve.app):  # commands that join the root
    app.registered_commands.extend(part.registered_commands)
    app.registered_groups.extend(part.registered_groups)
app.add_typer(theory.app, name="theory")
app.add_typer(models.app, name="models")
app.add_typer(warmstart.app, name="warmstart")

if __name__ == "__main__":
    app()
