"""The `regimen` command (see `app.py`): importing this package registers every command on `app`, in the order
`regimen --help` lists them (running and inspecting, rewards, serving, models over time)."""

# isort: off
from regimen.flows.cli.app import app, main
from regimen.flows.cli import run, reward_check, serving, models, store, trajectories  # noqa: F401 - each registers its commands
# isort: on

__all__ = ["app", "main"]
