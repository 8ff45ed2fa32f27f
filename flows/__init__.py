"""Prefect flows, deployments and the CLI: thin orchestration over `stages`."""

import os

# Log records of `regimen.*` loggers (e.g. the lines an `accelerate launch` subprocess prints) go to
# Prefect's log, so they show in the UI beside the task that ran them.
os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "regimen")
# Prefect's temporary server creates its database on first use; on a busy 2-core machine that can take
# longer than Prefect's default 20 s wait, after which every later call fails with "connection refused".
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
# The temporary server's anonymous usage telemetry is off unless asked for: on a machine without internet
# (a training box, CI) it prints an ERROR with a traceback at every run, which reads like Regimen failing.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# Likewise the Hugging Face hub's telemetry (TRL reports each trainer it builds): a training box often has
# no internet, and nothing Regimen does needs the hub to know.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# Logs of `regimen.*` loggers outside a flow run (the sandbox's, the store's lock) stay on the terminal and
# are not an error: they belong to no run in the UI.
os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")

import logging  # noqa: E402

logging.getLogger("regimen").setLevel(logging.INFO)

import atexit  # noqa: E402
import gc  # noqa: E402

# A process that imported torch, transformers and TRL holds millions of objects; at exit the interpreter's last
# collections walk them all, which costs a run of Regimen 1.3 s or more of CPU with nothing left to gain (every
# atexit handler, Prefect's flushes among them, has run by then). Frozen objects are left out of those walks;
# they are still freed as the modules go. Registered here, first among the handlers, so it runs last.
atexit.register(gc.freeze)
