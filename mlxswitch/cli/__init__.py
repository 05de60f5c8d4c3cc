"""The `mlxswitch` command line: the Typer app (app), its commands (cmd_*), chat loops (chat), Rich (ui)."""

from .app import app, main

__all__ = ["app", "main"]
