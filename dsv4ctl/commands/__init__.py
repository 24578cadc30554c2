"""CLI command groups. Each module exposes a typer app or functions registered by dsv4ctl.cli."""
