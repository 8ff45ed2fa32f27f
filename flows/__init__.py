"""Prefect flows, deployments and the CLI: thin orchestration over `stages`."""

import os

# Log records of `regimen.*` loggers (e.g. the lines an `accelerate launch` subprocess prints) go to
# Prefect's log, so they show in the UI beside the task that ran them.
os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "regimen")

import logging  # noqa: E402

logging.getLogger("regimen").setLevel(logging.INFO)
