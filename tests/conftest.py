"""Test setup: Prefect state in a temp dir, no analytics, no hub; the tiny recipe path."""

import atexit
import compileall
import json
import os
import shutil
import signal
import sys
import tempfile
import time
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

# Under pytest-xdist every worker inherits the controller's environment: each gets folders of its own below
# the shared ones, so two workers never share a Prefect database, a machine slot or a judge-baseline file
# (tests assume a machine of their own, as the serial run gives them).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER:
    for _name in ("PREFECT_HOME", "HF_DATASETS_CACHE", "REGIMEN_CACHE"):
        _own = os.path.join(os.environ[_name], _WORKER)
        os.makedirs(_own, exist_ok=True)
        os.environ[_name] = _own
    # one thread per worker: two workers' trainings on 2 cores with 2 threads each spin in each other's way
    # (an in-process training ran 3x slower than alone); subprocess trainings already take one thread
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# A suite started in the background of a shell without job control (`pytest ... &` in a script, nohup)
# inherits SIGINT ignored, and an ignored signal stays ignored across exec: every CLI a test starts would
# shrug off the Ctrl-C that the interruption tests send. Python's own handler back, as in a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "tests" / "tiny.yaml"


# One Prefect API per test process (each xdist worker, or the one process of `-n 0`), shared by the tests
# that do not start servers of their own: without it every `regimen run` a test starts would boot a
# temporary server of its own (about 5 s each, over a hundred runs in the suite). It is the same server
# the CLI starts (`regimen.flows.serving.server`, a child that dies with its parent), started as this process
# configures, before Prefect is imported (so every thread's settings carry its URL), and booting while the
# tests are collected. The tests of the temporary server itself take `no_shared_api`. Set
# REGIMEN_TESTS_SHARED_API=0 to run every test on temporary servers, as a user's `regimen run` does.
_SHARED_API: dict = {}
_ROLE = {"controller": False}  # the controller of xdist workers hears every worker's reports: it writes none


def _compile_sources() -> None:
    """Bytecode for Regimen's own modules, written once before any test runs. Where `PYTHONDONTWRITEBYTECODE` is set
    (this machine and CI set it) Python keeps nothing it compiles, so every process a test starts (each `regimen run`,
    served worker and launched rank) would compile flows/ and stages/ again; `compileall` writes the cache whatever
    that setting says (py_compile does not read it), and a source edited later is compiled again in memory, as
    Python always does with a stale cache. Measured: importing every module of both folders took 5.6 s with the
    cache and 6.0-6.4 s without it."""
    for folder in ("flows", "stages"):
        compileall.compile_dir(ROOT / folder, quiet=1)


def pytest_configure(config) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        _compile_sources()
    distributing = not os.environ.get("PYTEST_XDIST_WORKER") and (config.getoption("numprocesses", None) or 0) not in (
        0,
        None,
    )
    _ROLE["controller"] = distributing
    if distributing or os.environ.get("PREFECT_API_URL") or os.environ.get("REGIMEN_TESTS_SHARED_API", "1") == "0":
        return  # the controller of workers runs no test; a configured API is used as it is
    if "prefect" in sys.modules:  # too late to reach every thread's settings: temporary servers, as without
        return
    from regimen.flows.serving.server import TemporaryServer

    server = TemporaryServer()
    _SHARED_API["server"] = server
    os.environ["PREFECT_API_URL"] = server.url


def pytest_unconfigure(config) -> None:
    server = _SHARED_API.pop("server", None)
    if server is not None:
        server.stop()


@pytest.fixture(scope="session", autouse=True)
def shared_api():
    """The shared API answers before the first test (it booted during collection)."""
    server = _SHARED_API.get("server")
    if server is not None:
        server.ready()
    return server


@pytest.fixture
def no_shared_api(monkeypatch):
    """For a test of the temporary server: this test's runs (and the processes it starts) have no API
    configured, as a user's first `regimen run`."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        yield


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
    from regimen.flows.pipeline.cycle import RunResult, regimen_cycle_recipe
    from regimen.stages.core.errors import InputError, RegimenError
    from regimen.stages.recipe import load_recipe

    extra = dict(overrides or {})
    extra["store"] = str(store)
    # the experiment: data of the run
    state = regimen_cycle_recipe(load_recipe(config, extra), experiment, return_state=True)
    outcome = state.result(raise_on_failure=False)
    if not isinstance(outcome, RunResult):
        raise outcome
    if outcome.exit_code:
        from regimen.stages.core import errors

        kind = getattr(errors, outcome.error or "", None)
        if kind is errors.StageStopped:
            error = kind(outcome.stage, outcome.message.removeprefix(f"{outcome.stage}: "))
        else:
            error = (
                kind
                if isinstance(kind, type) and kind not in (errors.StageInterrupted,)
                else (InputError if outcome.exit_code == 2 else RegimenError)
            )(outcome.message)
        error.exit_code = outcome.exit_code
        error.results = outcome.results
        raise error
    return outcome.results


# Two workers on 2 cores (pytest-xdist, `-n auto --dist loadscope` in pyproject.toml): a test file is one unit of work
# (its module-scoped fixtures, often a training, are built once), files that share a session scenario are one
# unit, and the slowest units start first so that the workers end together. Timings: the seconds of each unit's
# tests in a full run on the 2-core machine with REGIMEN_TESTS_TIMELINE=FILE (each test's worker, start and end as
# JSON lines, below); a file not named here follows in its usual order. Units of under 15 s are left to that order.
_SHARED_UNITS = {"test_ui.py": "test_operations.py"}  # the UI test reads the operations scenario's runs
_SLOWEST_FIRST = [  # seconds of the file's tests on 2 workers, 2026-12-07 (a timeline of every test's start and end)
    "test_pool.py",
    "test_nightly_week.py",
    "test_api_boundary.py",
    "test_s3_store.py",
    "test_environments.py",  # 395 191 189 160 149
    "test_launch.py",
    "test_boundary.py",
    "test_trl_as_is.py",
    "test_operations.py",
    "test_reasoning_gym.py",  # 144 132 127 110 97
    "test_faults.py",
    "test_code_task.py",
    "test_distill.py",
    "test_layout.py",
    "test_reward_audit.py",  # 80 74 69 37 37
    "test_cycles_flow.py",
    "test_resume.py",
    "test_pipeline.py",
    "test_levels.py",
    "test_tracking.py",  # 35 33 30 29 27
    "test_screen.py",
    "test_sandbox.py",
    "test_judge_round_two.py",
    "test_real_model.py",
    "test_reward_check.py",  # 24 23 18 18 15
]


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its file, or the file whose scenario it shares."""
    path = nodeid.split("::", 1)[0]
    folder, _, name = path.rpartition("/")
    return f"{folder}/{_SHARED_UNITS[name]}" if name in _SHARED_UNITS else path


@pytest.hookimpl(optionalhook=True)  # a hook of xdist's (optional: no error where xdist is not loaded)
def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: one worker per core, at most 4 (each may train and start servers of its own). A worker more than
    the cores fills the CPU time that the tests waiting on Prefect's clock leave idle (12% to 14% with 2 workers on
    2 cores, 2% to 3% with 3), but sharing the cores costs as much: five suite runs alternating 3, 2, 3, 2, 3 workers
    on one evening took 985, 1,041, 1,108, 1,130 and 1,136 s, the machine slowing through the evening, and the
    3-worker runs sat on the line through the 2-worker ones (bench/README.md)."""
    return max(1, min(4, os.cpu_count() or 1))


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduling with our units as scopes. Why not `--dist loadgroup` and `xdist_group` marks:
    xdist 3.8 puts the group into `item._nodeid`, which pytest 9.2 no longer reads (its `nodeid` comes from
    `_id`), so the groups were silently ignored and one file's tests ran on both workers, each building the
    file's fixtures (the nightly week's 310 s training twice). Why `_split_scope`, a method of xdist's own: it is
    how xdist's `LoadFileScheduling` makes its scopes, and no public option joins two files into one unit
    (`--dist loadfile` would put test_ui.py apart from the operations scenario it reads). `tests/test_layout.py`
    checks the units hold."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return FileUnits(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    """The slowest units first (xdist's scope scheduling without reordering keeps this order)."""
    rank = {name: i for i, name in enumerate(_SLOWEST_FIRST)}
    # stable: a file keeps its order
    items.sort(key=lambda item: rank.get(unit_of(item.nodeid).rpartition("/")[2], len(rank)))


_TIMELINE = os.environ.get("REGIMEN_TESTS_TIMELINE")
_STARTED: dict[str, float] = {}


def pytest_runtest_logstart(nodeid, location) -> None:
    if _TIMELINE:
        _STARTED[nodeid] = time.time()


def pytest_runtest_logfinish(nodeid, location) -> None:
    """With REGIMEN_TESTS_TIMELINE=FILE, each test's worker, start and end (setup to teardown) as a JSON line: what
    the order of `_SLOWEST_FIRST` is measured from."""
    if _TIMELINE and not _ROLE["controller"] and nodeid in _STARTED:
        line = {"test": nodeid, "worker": _WORKER, "start": _STARTED.pop(nodeid), "end": time.time()}
        with open(_TIMELINE, "a") as f:
            f.write(json.dumps(line) + "\n")
