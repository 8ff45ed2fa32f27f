"""The sandbox server: one per worker slot, `python -I -S server.py --serve SETTINGS`, stdlib only.

The server starts the slot's zygote, probes isolation, then runs one job at a time: each is a `Sample`
(`sample.py`: hand it to the zygote, watch its CPU and wall clock, kill it when it runs over, read its
verdict) in a process tree forked from the zygote (`tree.py`: Z, B, S the solution, J the judge).

The sample's filesystem (`slot.py`, like the cgroups and the confinement): a fresh tmpfs root holding only, read-only,
the interpreter's standard library (its site-packages masked by an empty tmpfs) and the multiarch shared-library folders
its extension modules load from (with the /lib, /lib64 symlinks recreated) plus /etc/ld.so.cache; the installed packages
the operator allows the solution (`SandboxConfig.packages`) and pytest for the tests, one folder each under
`slot.PACKAGES_DIR` (nothing else of their site-packages); a minimal /dev (null, zero, full, random, urandom, a fresh
/dev/shm); a new /proc (`hidepid=invisible,subset=pid` where the kernel has it); a fresh size-limited tmpfs as the
sandbox's own temp folder, holding S's work folder and J's (`slot.WORKDIR_S`, `slot.WORKDIR_J`; paths inside the new
root, never the host's). The old root is detached after pivot_root, so the host's files, its pathname unix sockets, the
project and its data are simply not there. Abstract unix sockets and the network are per sample (a new network namespace
has only a loopback interface, which is down); so is SysV IPC.

Limits. Per slot: cgroups (v1, or v2 where delegated) with one CPU's worth of CPU time per period
(`cpus_per_slot`), a memory limit (the solution's `memory_mb` plus 256 MiB for the judge; within it
the kernel's OOM killer takes the solution's processes first and never the judge) and a pids limit;
Z joins them once, every process of every sample inherits them (a cgroup migration per sample would
cost milliseconds: it waits for an RCU grace period). The time limit
counts CPU: the server polls the slot's CPU usage (cpuacct.usage, or cpu.stat) and kills the sample
once it has used `timeout_s` seconds; a wall-clock backstop (`wall_timeout_s`) covers sleepers. Without
a CPU cgroup, RLIMIT_CPU per process is the fallback. rlimits (address space, file size, open files,
processes, no core) apply to S and J. The seccomp filter is built by the parent with libseccomp
(`syscalls.py`) and installed here by prctl (no libseccomp needed in here).

Why hand-written rather than bubblewrap or nsjail per sample: a warm server forks an interpreter that
is already started (and has the common standard-library modules imported): about 12 ms of CPU per
HumanEval sample for both processes together. Exec'ing `bwrap` and a fresh `python -I -S` per sample
took 23 ms for the solution's process alone, with nothing imported (bench/README.md, "Sandbox
throughput"). What is hand-written is the namespace and mount set-up (about 30 system calls, no
parsing of untrusted input, all before any untrusted code runs); the syscall filter comes from
libseccomp.

Without namespaces (not root, not Linux, no seccomp) the server refuses unless the caller allowed
unisolated execution; then S and J are still separate processes talking plain data, with rlimits, a
temporary folder each, the uid drop and cgroups where root, and the filter where libseccomp exists.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import sys
import time

if __name__ == "__main__":  # run as a script with -I -S: import the siblings by path
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, _HERE)
    from sample import Sample  # type: ignore[no-redef]
    from slot import _PIVOT_ROOT, PR_SET_PDEATHSIG, Slot, _oom_score_adj, _prctl  # type: ignore[no-redef]
    from tree import _zygote  # type: ignore[no-redef]

    sys.path.remove(_HERE)
else:
    from .sample import Sample
    from .slot import _PIVOT_ROOT, PR_SET_PDEATHSIG, Slot, _oom_score_adj, _prctl
    from .tree import _zygote

# site: S adds its exit(), quit() to the builtins for every solution
_PRELOAD = (
    "math",
    "cmath",
    "re",
    "collections",
    "itertools",
    "functools",
    "typing",
    "string",
    "heapq",
    "bisect",
    "operator",
    "random",
    "statistics",
    "fractions",
    "decimal",
    "json",
    "copy",
    "dataclasses",
    "hashlib",
    "datetime",
    "textwrap",
    "enum",
    "site",
)


class Server:
    def __init__(self, settings: dict):
        self.slot = Slot(settings)
        self.s = settings
        self.timeout_s = float(settings["timeout_s"])
        self.wall_s = float(settings["wall_timeout_s"])
        self.output_limit = int(settings["output_limit"])
        self.zsock: socket.socket | None = None
        self.zpid: int | None = None
        self.broken = False
        self._null: int | None = None

    def discard_fd(self) -> int | None:
        """A descriptor of /dev/null to splice unwanted output into (None where splice is missing);
        opened after the zygote was forked, so no sample inherits it."""
        if self._null is None and hasattr(os, "splice"):
            try:
                self._null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
            except OSError:
                pass
        return self._null

    def start(self) -> None:
        self.slot.setup_cgroups()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            try:
                ours.close()
                devnull = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):  # the job stream and the result stream are the server's alone
                    os.dup2(devnull, fd)
                os.close(devnull)
                self.slot.join_cgroups()
                _oom_score_adj(-1000)  # the trusted side (Z, B, J) is never the OOM killer's choice
                _zygote(self.slot, theirs)
            finally:
                os._exit(0)
        theirs.close()
        self.zsock, self.zpid = ours, pid

    def stop(self) -> None:
        if self._null is not None:
            os.close(self._null)
            self._null = None
        if self.zsock is not None:
            self.zsock.close()  # Z kills and reaps what is left below it, then exits
        if self.zpid is not None:
            for sig in (None, signal.SIGTERM, signal.SIGKILL):
                if sig is not None:
                    try:
                        os.kill(self.zpid, sig)
                    except OSError:
                        pass
                end = time.monotonic() + 3.0
                while time.monotonic() < end:
                    try:
                        if os.waitpid(self.zpid, os.WNOHANG)[0]:
                            break
                    except ChildProcessError:
                        break
                    time.sleep(0.005)
                else:
                    continue
                break
        self.slot.remove_cgroups()

    def run_job(self, job: dict, isolated: bool) -> dict:
        return Sample(self, job, isolated).run()


def _probe(server: Server) -> tuple[bool, str]:
    s = server.s
    if not sys.platform.startswith("linux"):
        return False, "not Linux"
    if not server.slot.root:
        return False, "not running as root: namespaces, mounts and the uid drop need it"
    if platform.machine() not in _PIVOT_ROOT:
        return False, f"no pivot_root syscall number known for {platform.machine()}"
    if not server.slot.seccomp:
        return False, f"no syscall filter: {s.get('seccomp_error') or 'libseccomp unavailable'}"
    here = os.path.dirname(os.path.abspath(__file__))
    code = (
        f"import os\nuid = os.getuid()\nsees_host = os.path.exists({here!r})\n"
        "def f(x):\n    return [x, {'k': (1.5, None, b'b', frozenset({1}))}]\n"
    )
    tests = [
        "import os\nassert uid != 0 and os.getuid() != 0 and uid != os.getuid()",
        f"import os\nassert not sees_host and not os.path.exists({here!r})",
        "assert f(2) == [2, {'k': (1.5, None, b'b', frozenset({1}))}]",
    ]
    r = server.run_job({"code": code, "tests": tests}, True)
    if r["status"] == "ok" and r["passed"] == len(tests):
        return True, ""
    return False, f"the isolation probe failed: {r['error'] or r['test_errors']} {r['output'][-300:]}".strip()


def serve(settings: dict) -> None:
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != int(settings["parent_pid"]):
        return
    for name in _PRELOAD:  # imported once here, shared by every fork of S and J
        try:
            __import__(name)
        except ImportError:
            pass
    server = Server(settings)
    server.start()
    out = sys.stdout.buffer
    try:
        if settings.get("isolation", True):
            isolated, reason = _probe(server)
        else:
            isolated, reason = False, "isolation is switched off (SandboxConfig.isolation=False)"
        ready = isolated or bool(settings.get("allow_unisolated"))
        hello = {
            "ready": ready,
            "isolated": isolated,
            "reason": reason,
            "cgroups": server.slot.cgroup_dirs,
            "cpu_accounting": server.slot.cpu_file is not None,
            "seccomp": server.slot.seccomp is not None,
        }
        out.write(json.dumps(hello).encode() + b"\n")
        out.flush()
        if not ready:
            return
        for line in sys.stdin.buffer:
            job = json.loads(line)
            n = len(job.get("tests", []))
            try:
                result = server.run_job(job, isolated)
            except Exception as exc:  # never let one job take the server (and the batch) down
                result = {
                    "passed": 0,
                    "total": n,
                    "tests": [False] * n,
                    "test_errors": [None] * n,
                    "status": "infra",
                    "error": f"sandbox server error: {type(exc).__name__}: {exc}",
                    "isolated": isolated,
                }
            del job, line
            out.write(json.dumps(result).encode() + b"\n")
            out.flush()
            if server.broken:
                return
    finally:
        server.stop()


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--serve":
    serve(json.loads(sys.argv[2]))
