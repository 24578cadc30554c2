"""``dsv4ctl schema [NAME]``: print a shipped JSON Schema (profile, playbook, plan, check-load, …);
without NAME, list them with their files."""

from __future__ import annotations

import sys
from typing import Optional

import typer


def schema(name: Optional[str] = typer.Argument(None, metavar="NAME", help="profile, playbook, plan, check-load, … (none: list them)."),
           path: bool = typer.Option(False, "--path", help="Print the schema file's path instead of its content."),
           as_json: bool = typer.Option(False, "--json", help="With no NAME: the list as JSON.")) -> None:
    """Print the JSON Schema NAME (draft 2020-12). Editors use the profile schema through the
    ``# yaml-language-server: $schema=...`` line of a profile. Exit 2 for an unknown name."""
    from ..errors import InputError
    from ..render import dump_json
    from ..resources import schema_names, schema_path
    names = schema_names()
    if name is None:
        if as_json:
            print(dump_json({"schema": "dsv4ctl.schemas/1", "schemas": [{"name": n, "path": str(schema_path(n))} for n in names]}))
        else:
            for n in names:
                print(f"{n:12} {schema_path(n)}")
        return
    if name not in names:
        raise InputError(f"schema: unknown schema {name!r} (one of: {', '.join(names)})")
    if path:
        print(schema_path(name))
        return
    sys.stdout.write(schema_path(name).read_text())


def register(app: typer.Typer) -> None:
    """Add ``schema``."""
    app.command("schema")(schema)
