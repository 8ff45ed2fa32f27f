"""`python -m regimen.flows.cli`: the `regimen` command."""

from regimen.flows.cli import main

main()
