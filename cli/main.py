"""The root `teamtr` command: each area's commands come from a module of this package."""

from __future__ import annotations

import typer

from teamtr.cli import eval as eval_cli
from teamtr.cli import models, serve, swap, theory, train

app = typer.Typer(
    name="teamtr",
    help="Write a team of LLM role agents as a LangGraph graph, train it with TeamTR, serve it.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

for part in (train.app, swap.app, eval_cli.app, serve.app):  # commands that join the root
    app.registered_commands.extend(part.registered_commands)
    app.registered_groups.extend(part.registered_groups)
app.add_typer(theory.app, name="theory")
app.add_typer(models.app, name="models")

if __name__ == "__main__":
    app()
