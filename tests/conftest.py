"""Test setup: Prefect state in a temp dir, no analytics, no hub; the tiny recipe path."""

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path


def _scratch(prefix: str) -> str:
    """A temp folder for this test session, removed when it ends."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, True)
    return path


_PREFECT_HOME = _scratch("regimen-prefect-")
os.environ.setdefault("PREFECT_HOME", _PREFECT_HOME)
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("HF_DATASETS_CACHE", _scratch("regimen-hf-datasets-"))
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("REGIMEN_CACHE", _scratch("regimen-cache-"))

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "tests" / "tiny.yaml"


@pytest.fixture
def tiny_recipe() -> Path:
    return TINY


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    """Run `regimen ARGS` in this process; returns (exit code, stdout, stderr)."""
    from regimen.flows.cli import main

    old = sys.argv
    sys.argv = ["regimen", *args]
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = old
    out = capsys.readouterr()
    return code, out.out, out.err


def run_flow(config: Path | str, store: Path | str, *, experiment: str | None = None, overrides: dict | None = None):
    """The flow as the CLI starts it: the recipe resolved once, then handed to `regimen_cycle_recipe`.
    Returns the stages' summaries; a run that stopped raises the error the CLI would exit with."""
    from regimen.flows.cycle import RunResult, regimen_cycle_recipe
    from regimen.stages.core.errors import InputError, RegimenError
    from regimen.stages.recipe import load_recipe

    extra = dict(overrides or {})
    extra["store"] = str(store)
    state = regimen_cycle_recipe(load_recipe(config, extra), experiment, return_state=True)  # the experiment: data of the run
    outcome = state.result(raise_on_failure=False)
    if not isinstance(outcome, RunResult):
        raise outcome
    if outcome.exit_code:
        from regimen.stages.core import errors

        kind = getattr(errors, outcome.error or "", None)
        if kind is errors.StageStopped:
            error = kind(outcome.stage, outcome.message.removeprefix(f"{outcome.stage}: "))
        else:
            error = (kind if isinstance(kind, type) and kind not in (errors.StageInterrupted,) else (InputError if outcome.exit_code == 2 else RegimenError))(outcome.message)
        error.exit_code = outcome.exit_code
        error.results = outcome.results
        raise error
    return outcome.results
