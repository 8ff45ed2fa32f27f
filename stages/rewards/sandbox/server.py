"""The sandbox server: one per worker slot, `python -I -S server.py --serve SETTINGS`, stdlib only.

Process tree of one sample (isolated mode, as root)::

    server (root, single-threaded; reads jobs on stdin, writes results on stdout; holds the tests)
      └─ Z, the zygote: forked at start-up, before the server read any job, so its memory never held a
         test, a solution or anything of an earlier sample. It joins the slot's cgroups and a UTS
         namespace of its own once. Per job it receives file descriptors only (memfds with the code
         and with the tests, the output and result pipes, a control socket) and forks:
           └─ A (root): unshare(mount, pid, network, IPC); forks B; hands B's pidfd to the server;
              waits for B and reports how it ended (`judge-exit`).
                └─ B (root, pid 1 of the new pid namespace): builds the sample's root filesystem from
                   an allow-list (below), pivot_root's into it, forks S (connected by a socketpair),
                   waits until S's set-up is done, then reads the tests and becomes J. When J ends,
                   every process of the namespace is killed.
                     └─ S, the solution (its own uid): reads the code from its memfd, keeps only the
                        socket and the output pipe, rlimits, oom_score_adj 1000, drops to the slot's
                        solution uid, no_new_privs, seccomp filter; then `callee.serve`.
                ( B as J, the judge (another uid, not dumpable, oom_score_adj -1000): keeps the socket,
                  the output pipe and the result pipe, same confinement; then `judge.run`, which
                  reports pass/fail on the result pipe. )

S is forked before B reads the tests, and never holds the result pipe or anything of J's; only J and
the trusted set-up side (A, B) write results, so nothing S does can forge a verdict or an `infra`.

The sample's filesystem: a fresh tmpfs root holding only, read-only, the interpreter's standard
library (its site-packages masked by an empty tmpfs) and the multiarch shared-library folders its
extension modules load from (with the /lib, /lib64 symlinks recreated) plus /etc/ld.so.cache; a minimal
/dev (null, zero, full, random, urandom, a fresh /dev/shm); a new /proc (`hidepid=invisible,subset=pid`
where the kernel has it); a fresh size-limited tmpfs on /tmp with /tmp/work (S's folder) and
/tmp/judge (J's). The old root is detached after pivot_root, so the host's files, its pathname unix
sockets, the project and its data are simply not there. Abstract unix sockets and the network are
per sample (a new network namespace has only a loopback interface, which is down); so is SysV IPC.

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

import ctypes
import json
import os
import platform
import resource
import select
import signal
import socket
import stat
import sys
import time

if __name__ == "__main__":  # run as a script with -I -S: import the siblings by path
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, _HERE)
    import callee  # type: ignore[no-redef]
    import judge  # type: ignore[no-redef]

    sys.path.remove(_HERE)
else:
    from . import callee, judge

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2
_PIVOT_ROOT = {"x86_64": 155, "amd64": 155, "aarch64": 41, "arm64": 41, "riscv64": 41, "ppc64le": 203, "ppc64": 203, "s390x": 217, "i686": 217, "i386": 217, "armv7l": 218}

WORKDIR_S = "/tmp/work"
WORKDIR_J = "/tmp/judge"
_OUTPUT_HARD_LIMIT = 8 << 20
_RESULT_LIMIT = 1 << 20
_EXIT_INFRA = 121
_DEV_NODES = ("null", "zero", "full", "random", "urandom")
_PRELOAD = ("math", "cmath", "re", "collections", "itertools", "functools", "typing", "string", "heapq", "bisect", "operator",
            "random", "statistics", "fractions", "decimal", "json", "copy", "dataclasses", "hashlib", "datetime", "textwrap", "enum")
_JUDGE_MEMORY_MB = 256  # the slot's memory cgroup holds the solution's memory_mb plus this for the judge
_JUDGE_AS_BYTES = 1 << 30  # the judge's address-space limit, whatever the solution's (it is trusted)
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}

_libc = None


def _c():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        argtypes = {
            "mount": [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p],
            "umount2": [ctypes.c_char_p, ctypes.c_int],
            "unshare": [ctypes.c_int],
            "prctl": [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong],
            "sethostname": [ctypes.c_char_p, ctypes.c_size_t],
        }
        for name, types in argtypes.items():
            if hasattr(_libc, name):  # not every libc has every call (not Linux)
                getattr(_libc, name).argtypes = types
        _libc.syscall.restype = ctypes.c_long
    return _libc


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _prctl(option: int, arg: int) -> None:
    if not hasattr(_c(), "prctl"):  # pragma: no cover - not Linux: the probe reports isolation unavailable
        return
    _check(_c().prctl(option, arg, 0, 0, 0), f"prctl({option})")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    # A remount without MS_BIND changes a filesystem (superblock) for every namespace: it would turn the
    # host's disk read-only. Only per-mount (bind) remounts are ever done here.
    if flags & MS_REMOUNT and not flags & MS_BIND:
        raise AssertionError("refusing a non-bind remount")
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(_c().mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _bind_remount(target: str, flags: int) -> None:
    try:
        keep = os.statvfs(target).f_flag & (MS_NODEV | MS_NOEXEC | MS_NOSUID)  # ST_* share the bits
    except OSError:
        keep = 0
    _mount(None, target, None, MS_BIND | MS_REMOUNT | keep | flags)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _seccomp_prog(program: bytes) -> tuple:
    """A `struct sock_fprog` for a BPF program (libseccomp's export), built once in the server."""
    buf = ctypes.create_string_buffer(program, len(program))
    return buf, _SockFprog(len(program) // 8, ctypes.addressof(buf))


def _install_seccomp(prog: tuple) -> None:
    """Install the filter on this (single-threaded) process; no_new_privs first, as the kernel requires."""
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    _check(_c().prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog[1]), 0, 0), "seccomp")


def _oom_score_adj(value: int) -> None:
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(value))
    except OSError:
        pass


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def _line(fd: int, text: str) -> None:
    """One result line (infra reports from the trusted side); short enough to be written atomically."""
    try:
        _write_all(fd, (" ".join(text.split())[:400] + "\n").encode("utf-8", "replace"))
    except OSError:
        pass


def _read_fd(fd: int) -> bytes:
    chunks = []
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _memfd(data: bytes) -> int:
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("regimen-sandbox", 0)
    else:  # pragma: no cover - not Linux
        import tempfile

        fd = os.dup(tempfile.TemporaryFile().fileno())
    _write_all(fd, data)
    return fd


def _place_fds(mapping: dict[int, int]) -> None:
    """Make fd `k` a copy of `v` for each item (k = 0..n-1), then close every other descriptor."""
    import fcntl

    high = {k: fcntl.fcntl(v, fcntl.F_DUPFD, 256) for k, v in mapping.items()}
    for k, v in high.items():
        os.dup2(v, k, inheritable=True)
    os.closerange(max(mapping) + 1, 1 << 20)


def _exit_code(status: int) -> int:
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _describe_status(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code == _EXIT_INFRA:
        return "sandbox set-up failed"
    if code > 128:
        sig = code - 128
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        hint = {"SIGXCPU": " (CPU time limit)", "SIGXFSZ": " (file size limit)", "SIGKILL": " (memory limit, or killed)", "SIGSEGV": " (crashed)", "SIGSYS": " (forbidden system call)"}
        return f"killed by {name}{hint.get(name, '')}"
    return f"exit status {code}"


# ------------------------------------------------------------------------------------------------
# The slot: settings, cgroups, the filesystem plan, confinement
# ------------------------------------------------------------------------------------------------


class Slot:
    def __init__(self, settings: dict):
        self.s = settings
        self.root = os.geteuid() == 0
        self.uids = {"s": int(settings["uid_s"]), "j": int(settings["uid_j"])}
        self.memory_bytes = int(settings["memory_mb"]) << 20
        self.seccomp = _seccomp_prog(bytes.fromhex(settings["seccomp"])) if settings.get("seccomp") else None
        self.cgroup_dirs: list[str] = []
        self.procs: list[str] = []  # cgroup.procs of the slot's group in each hierarchy
        self.cpu_file: tuple[str, str] | None = None  # (path, "cpuacct" | "cpu.stat")
        self.plan = self._plan()
        self.devices = [(n, os.stat(f"/dev/{n}").st_rdev) for n in _DEV_NODES if os.path.exists(f"/dev/{n}")]

    # cgroups ---------------------------------------------------------------------------------
    # One group per slot in each hierarchy, which the zygote joins once at start-up: every process of
    # every sample is forked below it, so no sample pays for a cgroup migration (a write to
    # cgroup.procs waits for an RCU grace period: milliseconds). Inside the group the judge is
    # protected from the solution by oom_score_adj (-1000 for J, +1000 for S) and by its own rlimits.
    def setup_cgroups(self) -> None:
        if not self.s.get("use_cgroups", True) or not self.root:
            return
        try:
            own: dict[str, str] = {}
            with open("/proc/self/cgroup") as f:
                for line in f:
                    _hid, ctrls, path = line.rstrip("\n").split(":", 2)
                    for c in ctrls.split(","):
                        own[c] = path
            v1: dict[str, set[str]] = {}
            v2 = None
            with open("/proc/self/mountinfo") as f:
                for line in f:
                    pre, _, post = line.partition(" - ")
                    fstype, _src, opts = (post.split(" ") + ["", "", ""])[:3]
                    point = pre.split(" ")[4]
                    if fstype == "cgroup":
                        ctrls = {c for c in opts.strip().split(",") if c in ("memory", "pids", "cpu", "cpuacct")}
                        if ctrls and point not in v1:
                            v1[point] = ctrls
                    elif fstype == "cgroup2" and v2 is None:
                        v2 = point
        except OSError:
            return
        name = f"regimen-sandbox-{os.getpid()}"
        memory = self.memory_bytes + (_JUDGE_MEMORY_MB << 20)  # the solution's share, plus the judge's
        pids = int(self.s["nproc"]) + 16
        cpus = float(self.s.get("cpus_per_slot") or 0)
        have: set[str] = set()
        for point, ctrls in v1.items():
            ctrl = next(iter(ctrls))
            if ctrl not in own:
                continue
            files: list[tuple[str, object]] = []
            if "cpu" in ctrls and cpus > 0:
                files += [("cpu.cfs_period_us", 100000), ("cpu.cfs_quota_us", int(cpus * 100000))]
            if "memory" in ctrls:
                files += [("memory.limit_in_bytes", memory), ("memory.memsw.limit_in_bytes", memory)]
            if "pids" in ctrls:
                files.append(("pids.max", pids))
            path = os.path.join(point + own[ctrl], name)
            if self._make(path, files):
                have |= ctrls
                if "cpuacct" in ctrls:
                    self.cpu_file = (os.path.join(path, "cpuacct.usage"), "cpuacct")
        if v2 is not None and "" in own:
            parent = v2 + own[""]
            try:
                with open(os.path.join(parent, "cgroup.subtree_control")) as f:
                    delegated = set(f.read().split())
            except OSError:
                delegated = set()
            wanted = {"memory", "pids", "cpu"} & delegated - have
            if wanted or "cpuacct" not in have:
                files = []
                if "cpu" in wanted and cpus > 0:
                    files.append(("cpu.max", f"{int(cpus * 100000)} 100000"))
                if "memory" in wanted:
                    files += [("memory.max", memory), ("memory.swap.max", 0)]
                if "pids" in wanted:
                    files.append(("pids.max", pids))
                path = os.path.join(parent, name)
                if self._make(path, files) and self.cpu_file is None:
                    self.cpu_file = (os.path.join(path, "cpu.stat"), "cpu.stat")
        if self.cpu_file is not None and self.cpu_usage() is None:
            self.cpu_file = None

    def _make(self, path: str, files: list) -> bool:
        parent = os.path.dirname(path)
        try:  # empty cgroups left by servers that were killed (SIGKILL skips their clean-up)
            for entry in os.listdir(parent):
                pid = entry[len("regimen-sandbox-") :]
                if entry.startswith("regimen-sandbox-") and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                    try:
                        os.rmdir(os.path.join(parent, entry))
                    except OSError:
                        pass
        except OSError:
            pass
        try:
            os.mkdir(path)
        except OSError:
            return False
        self.cgroup_dirs.append(path)
        for fname, value in files:
            try:
                with open(os.path.join(path, fname), "w") as f:
                    f.write(str(value))
            except OSError:
                pass
        self.procs.append(os.path.join(path, "cgroup.procs"))
        return True

    def join_cgroups(self) -> None:
        """Move the calling process (the zygote) into the slot's groups."""
        for path in self.procs:
            with open(path, "w") as f:
                f.write("0")

    def cpu_usage(self) -> float | None:
        """CPU seconds used by the slot's processes since the group was made."""
        if self.cpu_file is None:
            return None
        path, kind = self.cpu_file
        try:
            with open(path) as f:
                text = f.read()
            if kind == "cpuacct":
                return int(text) / 1e9
            for line in text.splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) / 1e6
        except (OSError, ValueError):
            pass
        return None

    def kill_cgroups(self, spare: int | None = None) -> None:
        """SIGKILL every process in the slot's groups but `spare` (the zygote)."""
        for _ in range(50):
            pids = set()
            for path in self.procs:
                try:
                    with open(path) as f:
                        pids.update(int(x) for x in f.read().split())
                except (OSError, ValueError):
                    pass
            pids.discard(spare)  # type: ignore[arg-type]
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.01)

    def remove_cgroups(self) -> None:
        self.kill_cgroups()
        self.cgroup_dirs.reverse()
        for path in self.cgroup_dirs:
            for _ in range(50):
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)

    # the filesystem ----------------------------------------------------------------------------
    @staticmethod
    def _plan() -> dict:
        """What the sample's root holds: read-only binds (dirs and files), symlinks, masked folders."""
        dirs: list[str] = []
        files: list[str] = []
        links: dict[str, str] = {}

        def links_along(path: str) -> None:
            parts = path.split("/")
            for k in range(2, len(parts) + 1):
                p = "/".join(parts[:k])
                if os.path.islink(p):
                    links.setdefault(p, os.readlink(p))

        stdlib = []
        for entry in sys.path:
            if not entry or not os.path.isabs(entry) or not os.path.exists(entry):
                continue
            links_along(entry)
            real = os.path.realpath(entry)
            (dirs if os.path.isdir(real) else files).append(real)
            if os.path.isdir(real):
                stdlib.append(real)
        import sysconfig

        multiarch = sysconfig.get_config_var("MULTIARCH") or ""
        for top in ("/lib", "/lib32", "/lib64", "/libx32", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libx32"):
            if os.path.islink(top):
                links.setdefault(top, os.readlink(top))
            elif os.path.isdir(top):
                if multiarch and os.path.isdir(os.path.join(top, multiarch)):
                    dirs.append(os.path.realpath(os.path.join(top, multiarch)))
                elif not multiarch and top.endswith("64"):
                    dirs.append(os.path.realpath(top))
        if os.path.isfile("/etc/ld.so.cache"):
            files.append("/etc/ld.so.cache")
        dirs = sorted(set(dirs))
        dirs = [d for d in dirs if not any(d != o and d.startswith(o + "/") for o in dirs)]
        files = [f for f in sorted(set(files)) if not any(f.startswith(d + "/") for d in dirs)]
        masks = [os.path.join(d, sub) for d in stdlib for sub in ("site-packages", "dist-packages") if os.path.isdir(os.path.join(d, sub))]
        for d in dirs:  # a symlink under a bound folder is visible through the bind already
            for p in list(links):
                if p.startswith(d + "/"):
                    del links[p]
        return {"dirs": dirs, "files": files, "links": sorted(links.items()), "masks": masks}

    def build_root(self) -> None:
        """In B (root, pid 1 of fresh namespaces): the sample's root filesystem, then pivot_root."""
        os.umask(0o022)
        _mount(None, "/", None, MS_REC | MS_PRIVATE)  # first: nothing below may propagate to the host
        plan = self.plan
        sources = [(p, os.open(p, os.O_PATH | os.O_CLOEXEC), True) for p in plan["dirs"]]
        sources += [(p, os.open(p, os.O_PATH | os.O_CLOEXEC), False) for p in plan["files"]]
        base = "/tmp" if os.path.isdir("/tmp") and not os.path.islink("/tmp") else "/mnt"
        # The root tmpfs allows device nodes (the five below, made here; it is read-only before any
        # untrusted code runs, and nobody in the sandbox may mknod); /tmp and /dev/shm are nodev.
        _mount("tmpfs", base, "tmpfs", MS_NOSUID, "size=1m,nr_inodes=4096,mode=755")
        r = base
        for path, fd, is_dir in sources:
            target = r + path
            os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
            if is_dir:
                os.makedirs(target, mode=0o755, exist_ok=True)
            else:
                os.close(os.open(target, os.O_WRONLY | os.O_CREAT, 0o644))
            _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND)
            os.close(fd)
            _bind_remount(target, MS_RDONLY | MS_NOSUID | MS_NODEV)
        os.mkdir(r + "/dev", 0o755)
        for name, rdev in self.devices:
            os.mknod(f"{r}/dev/{name}", 0o666 | stat.S_IFCHR, rdev)
            os.chmod(f"{r}/dev/{name}", 0o666)
        for mask in plan["masks"]:
            _mount("tmpfs", r + mask, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,nr_inodes=16,mode=755")
        for link, dest in plan["links"]:
            os.makedirs(os.path.dirname(r + link), mode=0o755, exist_ok=True)
            if not os.path.lexists(r + link):
                os.symlink(dest, r + link)
        for name, dest in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
            os.symlink(dest, f"{r}/dev/{name}")
        tmp_mb = int(self.s["tmpfs_mb"])
        for path, size in (("/tmp", tmp_mb), ("/dev/shm", max(1, tmp_mb // 4))):
            os.makedirs(r + path, mode=0o755, exist_ok=True)
            _mount("tmpfs", r + path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size}m,nr_inodes=4096,mode=1777")
        for role, path in (("s", WORKDIR_S), ("j", WORKDIR_J)):
            os.mkdir(r + path, 0o700)
            os.chown(r + path, self.uids[role], self.uids[role])
        os.makedirs(r + "/proc", mode=0o755, exist_ok=True)
        for options in ("hidepid=invisible,subset=pid", "hidepid=2", None):
            try:
                _mount("proc", r + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, options)
                break
            except OSError:
                if options is None:
                    raise
        _bind_remount(r, MS_RDONLY | MS_NOSUID)
        nr = _PIVOT_ROOT[platform.machine()]
        os.chdir(r)
        _check(_c().syscall(nr, b".", b"."), "pivot_root")
        _check(_c().umount2(b".", MNT_DETACH), "detach the old root")
        os.chdir("/")

    # confinement ---------------------------------------------------------------------------------
    def confine(self, role: str) -> None:
        """rlimits, the uid drop (as root), no_new_privs, the seccomp filter. Called in S or J."""
        s = self.s
        cpu = int(float(s["timeout_s"])) + 2
        limits = [
            (resource.RLIMIT_CPU, cpu),
            (resource.RLIMIT_AS, self.memory_bytes if role == "s" else max(self.memory_bytes, _JUDGE_AS_BYTES)),
            (resource.RLIMIT_FSIZE, (int(s["file_size_mb"]) << 20) if role == "s" else 1 << 20),
            (resource.RLIMIT_NOFILE, int(s["open_files"])),
            (resource.RLIMIT_CORE, 0),
        ]
        if self.root:  # as another user, RLIMIT_NPROC would count (and starve) that user's own processes
            limits.append((resource.RLIMIT_NPROC, int(s["nproc"]) if role == "s" else 8))
        for which, value in limits:
            resource.setrlimit(which, (value, value))
        if role == "s":
            _oom_score_adj(1000)  # in the slot's memory cgroup, the solution's processes go first
        if self.root:
            uid = self.uids[role]
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            if os.getuid() == 0 or os.geteuid() == 0:
                raise OSError("privilege drop failed")
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after the uid change, which clears it
        if role == "j":
            _prctl(PR_SET_DUMPABLE, 0)
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        if self.seccomp:
            _install_seccomp(self.seccomp)


# ------------------------------------------------------------------------------------------------
# The per-sample processes: Z (zygote), A, B, S, J
# ------------------------------------------------------------------------------------------------


def _zygote(slot: Slot, zsock: socket.socket) -> None:
    """Z: never returns. Its memory holds no job: it only ever receives file descriptors. It is the
    subreaper of everything below it, and when the server goes (its stream closes, or the server dies:
    SIGTERM by PDEATHSIG) it kills and reaps what is left, so no zombie is handed to init."""
    children: set[int] = set()

    def leave(*_: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        slot.kill_cgroups(spare=os.getpid())
        end = time.monotonic() + 5.0
        while time.monotonic() < end:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    time.sleep(0.005)
            except ChildProcessError:
                break
        os._exit(0)

    signal.signal(signal.SIGTERM, leave)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:  # the server died before the line above
        leave()
    if slot.s.get("isolation", True) and slot.root:
        # One UTS namespace per slot (hostname "sandbox"; nobody inside may change it). The network
        # namespace is per sample, like mounts, pids and IPC: a unix socket can outlive every process
        # of its sample (passed in flight inside a cycle of sockets until the kernel collects it), so
        # a network namespace shared by a slot's samples could carry a bit from one to the next.
        try:
            _check(_c().unshare(CLONE_NEWUTS), "unshare")
            _c().sethostname(b"sandbox", 7)
        except OSError:
            pass
    try:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans (B when A dies, daemons when unisolated) stay below Z
    except OSError:
        pass
    while True:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            children.discard(pid)
        try:
            msg, fds, _flags, _addr = socket.recv_fds(zsock, 16, 8)
        except OSError:
            leave()
        if not msg or len(fds) != 5:
            leave()
        try:
            pid = os.fork()
        except OSError as exc:
            _line(fds[3], f"infra could not fork: {exc}")
            pid = -1
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            zsock.close()
            _job_a(slot, msg == b"i", *fds)
        if pid > 0:
            children.add(pid)
        for fd in fds:
            os.close(fd)


def _job_a(slot: Slot, isolated: bool, code_fd: int, job_fd: int, out_w: int, res_w: int, ctl: int) -> None:
    """A: never returns. Unshares, forks B, hands B's pidfd to the server, reports how B (J) ended."""
    try:
        os.setsid()
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if isolated:  # the UTS namespace is the slot's, made once by Z (see _zygote)
            _check(_c().unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNET), "unshare")
        b = os.fork()
        if b == 0:
            os.close(ctl)
            _job_b(slot, isolated, code_fd, job_fd, out_w, res_w)
        for fd in (code_fd, job_fd, out_w):
            os.close(fd)
        pidfd = os.pidfd_open(b) if hasattr(os, "pidfd_open") else None
        with socket.socket(fileno=ctl) as sock:
            socket.send_fds(sock, [f"{b} {os.getpid()}".encode()], [pidfd] if pidfd is not None else [])
        if pidfd is not None:
            os.close(pidfd)
        _, status = os.waitpid(b, 0)
        _line(res_w, f"judge-exit {_exit_code(status)}")  # B has been reaped: its namespace is empty
        os._exit(0)
    except BaseException as exc:
        _line(res_w, f"infra {type(exc).__name__}: {exc}")
        os._exit(_EXIT_INFRA)


def _job_b(slot: Slot, isolated: bool, code_fd: int, job_fd: int, out_w: int, res_w: int) -> None:
    """B: never returns. Builds the root, forks S, then becomes J (pid 1: when J ends, every process
    of the namespace is killed)."""
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if isolated:
            slot.build_root()
        s_sock, j_sock = (end.detach() for end in socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM))
        st_r, st_w = os.pipe()
        s = os.fork()  # before anything of the job's tests is read into this process
        if s == 0:
            _role_s(slot, code_fd, s_sock, out_w, st_w)
        os.close(st_w)
        os.close(code_fd)
        os.close(s_sock)
        status = b""
        while chunk := os.read(st_r, 4096):
            status += chunk
        os.close(st_r)
        if status != b"k":
            _line(res_w, "infra the solution's process could not be set up: " + status[1:].decode("utf-8", "replace"))
            os._exit(_EXIT_INFRA)
    except BaseException as exc:
        _line(res_w, f"infra {type(exc).__name__}: {exc}")
        os._exit(_EXIT_INFRA)
    _role_j(slot, job_fd, j_sock, out_w, res_w)


def _role_s(slot: Slot, code_fd: int, sock: int, out_w: int, st_w: int) -> None:
    """S: never returns. Trusted set-up, then the untrusted code (callee.serve)."""
    try:
        spec = json.loads(_read_fd(code_fd))
        devnull = os.open(os.devnull, os.O_RDWR)
        _place_fds({0: devnull, 1: out_w, 2: out_w, 3: sock, 4: st_w})
        st_w = 4
        slot.confine("s")
        os.chdir(spec["workdir"])
        os.environ.clear()
        os.environ.update(_ENV, HOME=spec["workdir"], TMPDIR=spec["workdir"])
    except BaseException as exc:
        try:
            os.write(st_w, b"!" + f"{type(exc).__name__}: {exc}".encode("utf-8", "replace"))
        finally:
            os._exit(_EXIT_INFRA)
    os.write(st_w, b"k")
    os.close(st_w)
    code = spec["code"]
    del spec
    callee.serve(3, code)
    os._exit(0)


def _role_j(slot: Slot, job_fd: int, sock: int, out_w: int, res_w: int) -> None:
    """J: never returns."""
    try:
        job = json.loads(_read_fd(job_fd))
        devnull = os.open(os.devnull, os.O_RDWR)
        _place_fds({0: devnull, 1: out_w, 2: out_w, 3: res_w, 4: sock})
        res_w = 3
        slot.confine("j")
        os.chdir(job["workdir"])
        os.environ.clear()
        os.environ.update(_ENV, HOME=job["workdir"], TMPDIR=job["workdir"])
    except BaseException as exc:
        _line(res_w, f"infra the judge's process could not be set up: {type(exc).__name__}: {exc}")
        os._exit(_EXIT_INFRA)
    judge.run(job, 4, 3)
    os._exit(0)


# ------------------------------------------------------------------------------------------------
# The server: one job at a time
# ------------------------------------------------------------------------------------------------


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
                _oom_score_adj(-1000)  # the trusted side (Z, A, B, J) is never the OOM killer's choice
                _zygote(self.slot, theirs)
            finally:
                os._exit(0)
        theirs.close()
        self.zsock, self.zpid = ours, pid

    def stop(self) -> None:
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
        n = len(job["tests"])
        started = time.monotonic()
        workdirs = (WORKDIR_S, WORKDIR_J)
        if not isolated:
            import tempfile

            workdirs = (tempfile.mkdtemp(prefix="regimen-sandbox-s-"), tempfile.mkdtemp(prefix="regimen-sandbox-j-"))
            if self.slot.root:
                for role, path in zip("sj", workdirs):
                    os.chown(path, self.slot.uids[role], self.slot.uids[role])
        code_fd = _memfd(json.dumps({"code": job["code"], "workdir": workdirs[0]}).encode())
        job_fd = _memfd(json.dumps({"tests": job["tests"], "setup": job.get("setup"), "entry_point": job.get("entry_point"), "workdir": workdirs[1]}).encode())
        res_r, res_w = os.pipe()
        out_r, out_w = os.pipe()
        ctl, ctl_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            socket.send_fds(self.zsock, [b"i" if isolated else b"u"], [code_fd, job_fd, out_w, res_w, ctl_child.fileno()])  # type: ignore[arg-type]
            sent = True
        except OSError as exc:
            sent = False
            _line(res_w, f"infra the slot's zygote is gone: {exc}")
            self.broken = True
        finally:
            for fd in (code_fd, job_fd, out_w, res_w):
                os.close(fd)
            ctl_child.close()
        del job["code"]

        bufs = {res_r: bytearray(), out_r: bytearray()}
        open_fds = {res_r, out_r}
        for fd in bufs:
            os.set_blocking(fd, False)
        out_total = 0
        result_overflow = False
        b_pidfd: int | None = None
        pids: tuple[int, int] | None = None
        timed_out: str | None = None
        kill_sent = False
        cpu0 = self.slot.cpu_usage()
        cpu_used = 0.0
        wall_deadline = started + self.wall_s
        give_up = None  # after a kill: how long to wait for the result pipe to close
        finished = False

        def drain(fd: int) -> None:
            nonlocal out_total, result_overflow
            while fd in open_fds:
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    return
                except OSError:
                    chunk = b""
                if chunk and fd == out_r:
                    bufs[fd] += chunk[: max(0, self.output_limit - len(bufs[fd]))]
                    out_total += len(chunk)
                    if out_total <= _OUTPUT_HARD_LIMIT:
                        continue  # past the hard limit the pipe is closed: further writes fail
                elif chunk:
                    bufs[fd] += chunk
                    if len(bufs[fd]) <= _RESULT_LIMIT:
                        continue
                    result_overflow = True
                open_fds.discard(fd)
                os.close(fd)

        def kill() -> None:
            nonlocal kill_sent
            if b_pidfd is not None:
                try:
                    signal.pidfd_send_signal(b_pidfd, signal.SIGKILL)
                except OSError:
                    pass
                kill_sent = True
            elif pids is not None:
                try:
                    os.kill(pids[0], signal.SIGKILL)
                except OSError:
                    pass
                kill_sent = True
            if not isolated:
                if pids is not None:
                    try:
                        os.killpg(pids[1], signal.SIGKILL)
                    except OSError:
                        pass
                self.slot.kill_cgroups(spare=self.zpid)

        while sent and res_r in open_fds:
            now = time.monotonic()
            if timed_out is None:
                if now >= wall_deadline:
                    timed_out = f"timed out after {self.wall_s:g} s of wall-clock time"
                elif cpu0 is not None:
                    used = self.slot.cpu_usage()
                    if used is not None:
                        cpu_used = used - cpu0
                        if cpu_used >= self.timeout_s:
                            timed_out = f"timed out after {self.timeout_s:g} s of CPU time"
                if timed_out is not None:
                    give_up = now + 5.0
                    kill()
            elif not kill_sent:
                kill()
            if give_up is not None and now >= give_up:
                break
            limit = (give_up if give_up is not None else wall_deadline) - now
            watch = list(open_fds) + ([ctl.fileno()] if pids is None else [])
            ready, _, _ = select.select(watch, [], [], max(0.0, min(limit, 0.05 if cpu0 is not None else limit)))
            for fd in ready:
                if fd == ctl.fileno():
                    try:
                        msg, fds, _, _ = socket.recv_fds(ctl, 64, 1)
                        b, a = (int(x) for x in msg.split())
                        pids = (b, a)
                        b_pidfd = fds[0] if fds else None
                    except (OSError, ValueError):
                        pids = (0, 0)
                else:
                    drain(fd)
                    if fd == res_r and b"judge-exit " in bufs[res_r]:
                        finished = True
            if finished:
                break
        # A reported J's end (or the result pipe closed): B, which became J, has been reaped, and its
        # exit emptied the pid namespace. Unisolated, kill whatever is left in the slot's cgroups.
        if b_pidfd is not None:
            ready, _, _ = select.select([b_pidfd], [], [], 2.0)
            if not ready:
                kill()
                select.select([b_pidfd], [], [], 5.0)
            os.close(b_pidfd)
        if not isolated:
            if pids is not None and pids[1] > 0:
                try:
                    os.killpg(pids[1], signal.SIGKILL)
                except OSError:
                    pass
            self.slot.kill_cgroups(spare=self.zpid)
        end = time.monotonic() + 0.2
        while out_r in open_fds and time.monotonic() < end:
            if select.select([out_r], [], [], max(0.0, end - time.monotonic()))[0]:
                drain(out_r)
        for fd in list(open_fds):
            drain(fd)
            if fd in open_fds:
                open_fds.discard(fd)
                os.close(fd)
        ctl.close()
        if not isolated:
            import shutil

            for path in workdirs:
                shutil.rmtree(path, ignore_errors=True)
        if cpu0 is not None:
            used = self.slot.cpu_usage()
            if used is not None:
                cpu_used = used - cpu0
        output = bytes(bufs[out_r]).decode("utf-8", "replace")
        if out_total > len(bufs[out_r]):
            output += f"\n[... {out_total - len(bufs[out_r])} more bytes of output discarded]"
        result = verdict(bytes(bufs[res_r]), n, timed_out=timed_out, overflow=result_overflow)
        result.update(output=output, duration_s=round(time.monotonic() - started, 4), isolated=isolated,
                      cpu_s=round(cpu_used, 4) if cpu0 is not None else None)
        return result


def verdict(res: bytes, n: int, timed_out: str | None = None, overflow: bool = False) -> dict:
    """Turn the result pipe's lines (written by J, and by A/B for infra) into a result dict.

    J writes: `loaded` | `loadfail <why>`; `pass <i>` / `fail <i> <why>` for i = 0..n-1 in order (none
    after a loadfail); `gone <why>` at most once; `done <n>`. A, B or J write `infra <why>` when the
    sandbox (or the row's trusted set-up code) failed; B writes `judge-exit <code>` when J ended."""
    tests: list[bool] = []
    errors: list[str | None] = []
    infra = loadfail = gone = None
    loaded: bool | None = None
    judge_exit: int | None = None
    done = False
    malformed = overflow
    lines = res.split(b"\n")
    if lines[-1]:
        malformed = True
    for raw in lines[:-1]:
        kind, _, rest = raw.decode("utf-8", "replace").partition(" ")
        if kind == "infra":
            infra = infra or rest or "sandbox set-up failed"
        elif kind == "judge-exit" and rest.isdigit():
            judge_exit = int(rest)
        elif kind == "loaded" and loaded is None:
            loaded = True
        elif kind == "loadfail" and loaded is None:
            loaded, loadfail = False, rest or "unknown error"
        elif kind in ("pass", "fail") and loaded and not done:
            idx, _, info = rest.partition(" ")
            if idx != str(len(tests)) or len(tests) >= n:
                malformed = True
                continue
            tests.append(kind == "pass")
            errors.append(None if kind == "pass" else info or "failed")
        elif kind == "gone" and loaded and gone is None:
            gone = rest
        elif kind == "done" and rest == str(n) and loaded is not None and (len(tests) == n or loaded is False) and not done:
            done = True
        else:
            malformed = True
    failed = {"passed": 0, "total": n, "tests": [False] * n, "test_errors": [None] * n}
    if infra is not None:
        return {**failed, "status": "infra", "error": f"sandbox set-up failed: {infra}"}
    if timed_out:
        return {**failed, "status": "aborted", "error": timed_out}
    if malformed:  # only the trusted side writes here, so this is a bug, not the solution's doing
        return {**failed, "status": "infra", "error": "the judge's report was malformed"}
    if not done:
        return {**failed, "status": "aborted", "error": f"the judge did not finish ({_describe_status(judge_exit)})"}
    if loaded is False:
        return {**failed, "status": "ok", "error": f"the solution failed to load: {loadfail}"}
    error = f"the solution's process ended early: {gone}" if gone else None
    return {"passed": sum(tests), "total": n, "tests": tests, "test_errors": errors, "status": "ok", "error": error}


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
    code = f"import os\nuid = os.getuid()\nsees_host = os.path.exists({here!r})\ndef f(x):\n    return [x, {{'k': (1.5, None, b'b', frozenset({{1}}))}}]\n"
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
        hello = {"ready": ready, "isolated": isolated, "reason": reason, "cgroups": server.slot.cgroup_dirs,
                 "cpu_accounting": server.slot.cpu_file is not None, "seccomp": server.slot.seccomp is not None}
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
                result = {"passed": 0, "total": n, "tests": [False] * n, "test_errors": [None] * n, "status": "infra",
                          "error": f"sandbox server error: {type(exc).__name__}: {exc}", "isolated": isolated}
            del job, line
            out.write(json.dumps(result).encode() + b"\n")
            out.flush()
            if server.broken:
                return
    finally:
        server.stop()


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--serve":
    serve(json.loads(sys.argv[2]))
