"""The `mlxswitch` command line: Typer commands (app), chat loops (chat), all Rich code (ui)."""

from .app import app, main

__all__ = ["app", "main"]
