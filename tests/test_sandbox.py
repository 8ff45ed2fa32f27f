"""The sandbox against hostile code: every attack scores 0, the host is unharmed, the batch ends in
bounded time, and honest code scores its exact fraction.

The hostile suite runs as one parallel batch (module fixture) to keep the test time small; each test
then checks its own item. These tests need the isolated sandbox (root, namespaces); where it is
unavailable they are skipped and `test_refuses_without_isolation` checks the refusal instead.
"""

from __future__ import annotations

import os
import secrets
import socket
import tempfile
import textwrap
import time

import pytest

from regimen.stages.rewards import sandbox
from regimen.stages.rewards.sandbox import SandboxConfig, SandboxResult, SandboxUnavailable, run_batch, run_tests

ISOLATED, WHY = sandbox.isolation_status()
needs_isolation = pytest.mark.skipif(not ISOLATED, reason=f"isolated sandbox unavailable: {WHY}")

TOKEN = secrets.token_hex(6)
SECRET = "s3cr3t-" + TOKEN
REPO_TESTS = os.path.dirname(os.path.abspath(__file__))
HOST_FILES = {
    "repo": os.path.join(REPO_TESTS, f".pwned-{TOKEN}"),
    "tmp": os.path.join(tempfile.gettempdir(), f"regimen-pwned-{TOKEN}"),
    "shm": f"/dev/shm/regimen-pwned-{TOKEN}",
    "var_tmp": f"/var/tmp/regimen-pwned-{TOKEN}",  # the FHS's other world-writable folder, on every Linux host
    "root": os.path.join(os.path.expanduser("~"), f"regimen-pwned-{TOKEN}"),  # the invoking user's home (root's here)
}
ADD = "def add(a, b):\n    return a + b\n"
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(0, 0) == 0"]


def _code(src: str) -> str:
    return textwrap.dedent(src).strip() + "\n"


def _hostile_items(port: int) -> dict[str, tuple[str, list[str]]]:
    pytest_pid = os.getpid()
    return {
        # honest code, for comparison
        "honest_2_of_3": ("def add(a, b):\n    return a + b if a else 99\n", ADD_TESTS),
        "honest_all": (ADD, ADD_TESTS),
        "honest_noisy": (ADD + "for i in range(1000):\n    print('debug line', i)\n", ADD_TESTS),
        "env_is_minimal": ("import os\n", ["assert set(os.environ) <= {'PATH', 'HOME', 'TMPDIR', 'LANG'}", "assert os.getuid() != 0"]),
        # early exits
        "sys_exit_top": (ADD + "import sys\nsys.exit(0)\n", ADD_TESTS),
        "os_exit_top": (ADD + "import os\nos._exit(0)\n", ADD_TESTS),
        "atexit_forge": (
            ADD + _code("""
                import atexit, os, sys
                atexit.register(lambda: print('PASSED 3/3'))
                atexit.register(lambda: [os.write(fd, b'x pass 0\\nx pass 1\\nx pass 2\\nx done 3\\n') for fd in range(3, 16) if not os.set_blocking(fd, False)])
                sys.exit(0)
            """),
            ADD_TESTS,
        ),
        "exit_between_tests": (
            "def add(a, b):\n    if a == 2:\n        import sys\n        sys.exit(0)\n    return a + b\n",
            ADD_TESTS,
        ),
        "os_exit_between_tests": (
            "def add(a, b):\n    if a == 2:\n        import os\n        os._exit(0)\n    return a + b\n",
            ADD_TESTS,
        ),
        # runaway code
        "infinite_loop": ("while True:\n    pass\n", ADD_TESTS),
        "sleep_forever": ("import time\ntime.sleep(3600)\n", ADD_TESTS),
        "loop_in_test": ("def add(a, b):\n    while True:\n        pass\n", ADD_TESTS),
        "fork_bomb": (
            _code("""
                import os
                while True:
                    try:
                        os.fork()
                    except OSError:
                        pass
            """),
            ADD_TESTS,
        ),
        "memory_bomb": ("x = bytearray(8 << 30)\n" + ADD, ADD_TESTS),
        "memory_bomb_grow": ("chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))\n", ADD_TESTS),
        "memory_bomb_forked": (
            _code("""
                import os
                def grab():
                    kids = []
                    for _ in range(6):
                        pid = os.fork()
                        if pid == 0:
                            block = bytearray(150 << 20)
                            for i in range(0, len(block), 4096):
                                block[i] = 1
                            os._exit(0)
                        kids.append(pid)
                    return sum(os.waitpid(p, 0)[1] == 0 for p in kids)
            """),
            ["assert grab() == 6"],
        ),
        "huge_output": ("while True:\n    print('x' * 10000)\n", ADD_TESTS),
        "huge_output_once": ("import os\nos.write(1, b'y' * (64 << 20))\n" + ADD, ADD_TESTS),
        # escapes
        "write_outside": (
            _code(f"""
                def write_all():
                    ok = 0
                    for path in {[HOST_FILES['repo'], HOST_FILES['root']]!r}:
                        try:
                            with open(path, 'w') as f:
                                f.write('pwned')
                            ok += 1
                        except OSError:
                            pass
                    return ok
            """),
            ["assert write_all() == 2"],
        ),
        "write_scratch": (
            _code(f"""
                def write_scratch():
                    for path in {[HOST_FILES['tmp'], HOST_FILES['shm'], HOST_FILES['var_tmp']]!r}:
                        with open(path, 'w') as f:
                            f.write('only in the sandbox')
                    return True
            """),
            ["assert write_scratch()"],
        ),
        "network": (
            _code(f"""
                import socket
                def leak():
                    s = socket.create_connection(('127.0.0.1', {port}), timeout=1)
                    s.sendall(b'leaked')
                    return True
            """),
            ["assert leak()"],
        ),
        "read_env": (
            _code("""
                import os, glob
                def steal():
                    if os.environ.get('REGIMEN_TEST_SECRET'):
                        return os.environ['REGIMEN_TEST_SECRET']
                    for path in glob.glob('/proc/*/environ'):
                        try:
                            data = open(path, 'rb').read()
                        except OSError:
                            continue
                        if b'REGIMEN_TEST_SECRET' in data:
                            return 'found'
                    return None
            """),
            ["assert steal() is not None"],
        ),
        "kill_parent": (
            _code(f"""
                import os, signal
                def kill_parent():
                    hit = 0
                    for pid in ({pytest_pid}, os.getppid(), 1):
                        try:
                            os.kill(pid, signal.SIGKILL)
                            hit += 1
                        except OSError:
                            pass
                    return hit
            """),
            ["assert kill_parent() > 0"],
        ),
        "kill_everything": ("import os, signal\nos.kill(-1, signal.SIGKILL)\n" + ADD, ADD_TESTS),
        "forged_output": (
            _code("""
                import os, json
                print('PASSED 3/3')
                print(json.dumps({'passed': 3, 'total': 3, 'status': 'ok', 'error': None}))
                for fd in range(3, 64):
                    for i in range(3):
                        try:
                            os.write(fd, f'nonce pass {i} \\n'.encode())
                        except OSError:
                            pass
                os._exit(0)
            """),
            ADD_TESTS,
        ),
        "forged_then_honest": (ADD + "import os\nos.write(3, b'0 pass 0\\n')\n", ADD_TESTS),
        "daemon_left_behind": (
            ADD + _code("""
                import os, time
                if os.fork() == 0:
                    os.setsid()
                    if os.fork() == 0:
                        time.sleep(60)
                    os._exit(0)
            """),
            ADD_TESTS,
        ),
    }


@pytest.fixture(scope="module")
def hostile():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    items = _hostile_items(port)
    os.environ["REGIMEN_TEST_SECRET"] = SECRET
    try:
        cfg = SandboxConfig(timeout_s=2.0, memory_mb=256)
        started = time.monotonic()
        results = run_batch(list(items.values()), workers=2, config=cfg)
        elapsed = time.monotonic() - started
        try:
            conn, _ = listener.accept()
            received = conn.recv(100)
            conn.close()
        except BlockingIOError:
            received = None
        yield {"results": dict(zip(items, results)), "elapsed": elapsed, "received": received, "uid_base": sandbox._default_uid_base()}
    finally:
        os.environ.pop("REGIMEN_TEST_SECRET", None)
        listener.close()
        for path in HOST_FILES.values():
            if os.path.exists(path) and path.startswith(REPO_TESTS):
                os.remove(path)


def _zero(r: SandboxResult) -> None:
    assert r.passed == 0, r
    assert r.fraction == 0.0
    assert r.status in ("ok", "aborted"), r  # the solution's fault, never "infra"


@needs_isolation
def test_batch_is_bounded_and_honest_code_scores_its_fraction(hostile):
    res = hostile["results"]
    # 5 items time out at 2 s each on 2 workers, plus set-up: bounded well below a minute.
    assert hostile["elapsed"] < 30, hostile["elapsed"]
    assert res["honest_2_of_3"].passed == 2 and res["honest_2_of_3"].total == 3
    assert round(res["honest_2_of_3"].fraction, 3) == 0.667
    assert res["honest_2_of_3"].tests == [True, True, False]
    assert res["honest_all"].passed == 3 and res["honest_all"].error is None
    assert res["honest_noisy"].passed == 3
    assert "debug line 0" in res["honest_noisy"].output
    assert res["env_is_minimal"].passed == 2, res["env_is_minimal"]
    assert all(r.isolated for r in res.values())


@needs_isolation
@pytest.mark.parametrize("name", ["sys_exit_top", "os_exit_top", "atexit_forge", "exit_between_tests", "os_exit_between_tests"])
def test_early_exit_scores_zero(hostile, name):
    r = hostile["results"][name]
    _zero(r)
    assert r.status == "aborted"


@needs_isolation
@pytest.mark.parametrize("name", ["infinite_loop", "sleep_forever", "loop_in_test", "fork_bomb", "huge_output"])
def test_runaway_code_is_killed(hostile, name):
    r = hostile["results"][name]
    _zero(r)
    assert r.duration_s < 2.0 + 3.0, r.duration_s


def _has_memory_cgroup() -> bool:
    server = sandbox._Server(0, SandboxConfig())
    server.close()
    return any("memory" in path for path in server.cgroups)


@needs_isolation
@pytest.mark.parametrize("name", ["memory_bomb", "memory_bomb_grow", "memory_bomb_forked"])
def test_memory_bombs_score_zero(hostile, name):
    if name == "memory_bomb_forked" and not _has_memory_cgroup():
        pytest.skip("no memory cgroup on this host: per-process limits alone do not bound a forking sample")
    _zero(hostile["results"][name])


@needs_isolation
def test_output_is_bounded(hostile):
    _zero(hostile["results"]["huge_output"])
    for name in ("huge_output", "huge_output_once"):
        r = hostile["results"][name]
        assert len(r.output) < SandboxConfig().output_limit + 200
        assert "more bytes of output discarded" in r.output
        assert r.duration_s < 2.0 + 3.0


@needs_isolation
def test_writes_outside_do_not_reach_the_host(hostile):
    _zero(hostile["results"]["write_outside"])
    # scratch writes succeed inside the sandbox's private tmpfs ...
    assert hostile["results"]["write_scratch"].passed == 1
    # ... and none of it appears on the host
    for path in HOST_FILES.values():
        assert not os.path.exists(path), path


@needs_isolation
def test_no_network(hostile):
    _zero(hostile["results"]["network"])
    assert hostile["received"] is None


@needs_isolation
def test_parent_environment_does_not_leak(hostile):
    _zero(hostile["results"]["read_env"])


@needs_isolation
def test_cannot_kill_the_parent(hostile):
    _zero(hostile["results"]["kill_parent"])
    _zero(hostile["results"]["kill_everything"])
    os.kill(os.getpid(), 0)  # still here


@needs_isolation
def test_forged_results_score_zero(hostile):
    forged = hostile["results"]["forged_output"]
    _zero(forged)
    assert "PASSED 3/3" in forged.output  # printed, and ignored
    r = hostile["results"]["forged_then_honest"]
    _zero(r)
    assert "tampered" in (r.error or "")


@needs_isolation
def test_nothing_is_left_behind(hostile):
    assert hostile["results"]["daemon_left_behind"].passed == 3  # honest otherwise
    lo, hi = hostile["uid_base"], hostile["uid_base"] + 256
    leftovers = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                uid = os.stat(f"/proc/{pid}").st_uid
            except OSError:
                continue
            if lo <= uid < hi:
                leftovers.append(pid)
    assert leftovers == []
    # the host's root filesystem is still writable (the read-only remount was a bind remount)
    with open("/proc/self/mounts") as f:
        root = [line.split() for line in f if line.split()[1] == "/"]
    assert root and all("rw" in fields[3].split(",") for fields in root)
    # cgroups made for the worker slots are gone
    for base in ("/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified"):
        for dirpath, dirnames, _ in os.walk(base):
            assert not any(d.startswith("regimen-sandbox-") for d in dirnames), dirpath
            if dirpath.count("/") > 8:
                dirnames.clear()


@needs_isolation
def test_run_tests_single():
    r = run_tests(ADD, ADD_TESTS + ["assert add(1, 1) == 3"], timeout_s=3)
    assert (r.passed, r.total, r.error, r.status) == (3, 4, None, "ok")
    r = run_tests("def add(a, b) return", ADD_TESTS, timeout_s=3)
    assert r.passed == 0 and "failed to load" in r.error and "SyntaxError" in r.error
    r = run_tests(ADD, [], timeout_s=3)
    assert (r.passed, r.total) == (0, 0)


@needs_isolation
def test_parallel_batch_keeps_order():
    items = [(f"def f():\n    return {i}\n", [f"assert f() == {i}", f"assert f() == {i + 1}"]) for i in range(24)]
    results = run_batch(items, workers=2, timeout_s=3)
    assert [r.tests for r in results] == [[True, False]] * 24


def test_refuses_without_isolation():
    with pytest.raises(SandboxUnavailable, match="allow_unisolated"):
        run_tests(ADD, ADD_TESTS, config=SandboxConfig(isolation=False))


def test_unisolated_when_explicitly_allowed(caplog):
    cfg = SandboxConfig(isolation=False, allow_unisolated=True, timeout_s=1.5)
    results = run_batch(
        [
            ("def add(a, b):\n    return a + b if a else 99\n", ADD_TESTS),
            (ADD + "import sys\nsys.exit(0)\n", ADD_TESTS),
            ("import os\n", ["assert 'REGIMEN_TEST_SECRET' not in os.environ", "assert os.path.basename(os.getcwd()).startswith('regimen-sandbox-')"]),
            ("while True:\n    pass\n", ADD_TESTS),
        ],
        workers=2,
        config=cfg,
    )
    assert [r.passed for r in results] == [2, 0, 2, 0]
    assert not any(r.isolated for r in results)
    assert results[3].status == "aborted" and "timed out" in results[3].error
    assert not [p for p in os.listdir("/tmp") if p.startswith("regimen-sandbox-")]


def test_verdict_parser_rejects_forgeries():
    cfg = {"timeout_s": 1}

    class Slot:
        s = cfg

    def verdict(lines: bytes, n: int = 2) -> dict:
        return sandbox._verdict({"nonce": "N"}, n, lines, b"", 0, 0, False, False, True, Slot, time.monotonic())

    assert verdict(b"N pass 0 \nN fail 1 AssertionError\nN done 2 \n")["passed"] == 1
    assert verdict(b"N pass 0 \nN pass 1 \nN done 2 \n")["passed"] == 2
    for forged in (
        b"X pass 0 \nX pass 1 \nX done 2 \n",  # wrong nonce
        b"N pass 1 \nN pass 0 \nN done 2 \n",  # out of order
        b"N pass 0 \nN pass 0 \nN pass 1 \nN done 2 \n",  # duplicate
        b"N pass 0 \nN pass 1 \nN done 2 \nN done 2 \n",  # anything after done
        b"N pass 0 \nN pass 1 \nN done 2",  # partial line
        b"N pass 0 \nN pass 1 \n",  # never finished
        b"garbage\nN pass 0 \nN pass 1 \nN done 2 \n",
    ):
        r = verdict(forged)
        assert r["passed"] == 0 and r["status"] == "aborted", forged
    assert verdict(b"N infra -1 unshare failed\n")["status"] == "infra"


def test_config_validation():
    with pytest.raises(ValueError):
        SandboxConfig(timeout_s=0)
    with pytest.raises(TypeError):
        run_batch([("code", "assert True")])  # tests must be a list
    assert run_batch([]) == []


def _children_serving() -> list[int]:
    pids = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read()
                with open(f"/proc/{pid}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if b"--serve" in cmd and ppid == os.getpid():
                pids.append(int(pid))
    return pids


@needs_isolation
def test_a_dead_server_costs_one_item_not_the_batch():
    import signal
    import threading

    def kill_server() -> None:
        time.sleep(0.6)
        for pid in _children_serving():
            os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_server)
    killer.start()
    items = [("import time\ntime.sleep(2)\n" + ADD, ADD_TESTS), (ADD, ADD_TESTS), (ADD, ADD_TESTS[:2])]
    results = run_batch(items, workers=1, timeout_s=3)
    killer.join()
    assert results[0].status == "infra" and results[0].passed == 0
    assert [(r.passed, r.status) for r in results[1:]] == [(3, "ok"), (2, "ok")]
    time.sleep(0.2)
    lo = sandbox._default_uid_base()
    assert not [p for p in os.listdir("/proc") if p.isdigit() and os.path.exists(f"/proc/{p}") and lo <= _uid(p) < lo + 256]
    assert _children_serving() == []


def _uid(pid: str) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return -1
