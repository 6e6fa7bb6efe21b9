"""`python -m teamtr.cli ...` (e.g. under torchrun) runs the `teamtr` command."""

from teamtr.cli.main import app

app()
