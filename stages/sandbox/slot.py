"""A worker slot's isolation: its cgroups, the sample's root filesystem, and the confinement of the
solution's and the judge's processes (rlimits, uid drop, no_new_privs, the seccomp filter).

Used by the sandbox server (`server.py`), in the processes it forks; every call here runs as root
before any untrusted code. Hand-written for the reasons given in server.py's docstring; the only
parsing is of the kernel's own files (/proc/self/cgroup, /proc/self/mountinfo). Stdlib only: the
server imports it by path (`python -I -S`).
"""

from __future__ import annotations

import ctypes
import os
import platform
import resource
import signal
import stat
import sys
import time

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
# fmt: off
_PIVOT_ROOT = {"x86_64": 155, "amd64": 155, "aarch64": 41, "arm64": 41, "riscv64": 41, "ppc64le": 203, "ppc64": 203,
               "s390x": 217, "i686": 217, "i386": 217, "armv7l": 218}  # pivot_root's syscall number by machine
# fmt: on

# A path inside the sandbox's fresh root (its private tmpfs after pivot_root), never the host's /tmp: the
# working folder S and J share, as a plain harness's one working folder (a test writes a file the solution
# reads, or the reverse). World-writable and sticky; S may make no links at all (its syscall filter), so
# nothing it leaves there can send a write of J's elsewhere.
WORKDIR = "/tmp/work"
WORKDIR_S = WORKDIR_J = WORKDIR  # the names the server's job specs use
ZONEINFO = "/usr/share/zoneinfo"  # the system's time zone data, read-only (zoneinfo.ZoneInfo reads it)
# Where the installed packages a sample may import (`SandboxConfig.packages`, and pytest for the tests) are
# bound, read-only, one folder or file each: a path inside the sample's root that names nothing of the
# host's (not the virtualenv's site-packages, whose other packages and files stay out of reach).
PACKAGES_DIR = "/usr/lib/regimen-packages"
_DEV_NODES = ("null", "zero", "full", "random", "urandom")
_JUDGE_MEMORY_MB = 256  # the slot's memory cgroup holds the solution's memory_mb plus this for the judge
_JUDGE_AS_BYTES = 1 << 30  # the judge's address-space limit, whatever the solution's (it is trusted)

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
            "setns": [ctypes.c_int, ctypes.c_int],
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
        self.seccomp_s = (
            _seccomp_prog(bytes.fromhex(settings["seccomp_s"])) if settings.get("seccomp_s") else self.seccomp
        )
        self.cgroup_dirs: list[str] = []
        self.procs: list[str] = []  # cgroup.procs of the slot's group in each hierarchy
        self.cpu_file: tuple[str, str] | None = None  # (path, "cpuacct" | "cpu.stat")
        self.plan = self._plan()
        self.plan["packages"] = [
            (src, f"{PACKAGES_DIR}/{os.path.basename(src)}")
            for src in settings.get("package_paths") or []
            if type(src) is str and os.path.isabs(src) and os.path.exists(src)
        ]
        self.template: str | None = None  # the slot's read-only root, made once by Z (build_template)
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
        for _ in range(500):  # up to a second, in short steps (what is left is usually gone at once)
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
            time.sleep(0.002)

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
        if os.path.isdir(ZONEINFO):
            links_along(ZONEINFO)
            dirs.append(os.path.realpath(ZONEINFO))
        if os.path.isfile("/etc/ld.so.cache"):
            files.append("/etc/ld.so.cache")
        dirs = sorted(set(dirs))
        dirs = [d for d in dirs if not any(d != o and d.startswith(o + "/") for o in dirs)]
        files = [f for f in sorted(set(files)) if not any(f.startswith(d + "/") for d in dirs)]
        masks = [
            os.path.join(d, sub)
            for d in stdlib
            for sub in ("site-packages", "dist-packages")
            if os.path.isdir(os.path.join(d, sub))
        ]
        for d in dirs:  # a symlink under a bound folder is visible through the bind already
            for p in list(links):
                if p.startswith(d + "/"):
                    del links[p]
        return {"dirs": dirs, "files": files, "links": sorted(links.items()), "masks": masks}

    def build_template(self) -> None:
        """In Z, once per slot, when samples are isolated: the read-only part of every sample's root
        (the allow-listed binds, /dev's nodes and links, the masks, the mount points of what each sample
        gets fresh), in Z's own private mount namespace, on /mnt (hidden there from nothing but Z). Each
        sample's A copies it with its own mount namespace, so B only mounts the sample's /tmp, /dev/shm
        and /proc before pivot_root: 3 mounts instead of about 20 (and their remounts)."""
        base = "/mnt"
        if not os.path.isdir(base) or os.path.islink(base):
            return
        _check(_c().unshare(CLONE_NEWNS), "unshare")
        _mount(None, "/", None, MS_REC | MS_PRIVATE)  # first: nothing below may propagate to the host
        self._read_only_tree(base)
        for path in ("/tmp", "/dev/shm", "/proc"):
            os.makedirs(base + path, mode=0o755, exist_ok=True)
        _bind_remount(base, MS_RDONLY | MS_NOSUID)
        self.template = base

    def _read_only_tree(self, r: str) -> None:
        os.umask(0o022)
        plan = self.plan
        sources = [(p, os.open(p, os.O_PATH | os.O_CLOEXEC), True) for p in plan["dirs"]]
        sources += [(p, os.open(p, os.O_PATH | os.O_CLOEXEC), False) for p in plan["files"]]
        sources += [
            (target, os.open(src, os.O_PATH | os.O_CLOEXEC), os.path.isdir(src))
            for src, target in plan.get("packages", [])
        ]
        # The root tmpfs allows device nodes (the five below, made here; it is read-only before any
        # untrusted code runs, and nobody in the sandbox may mknod); /tmp and /dev/shm are nodev.
        _mount("tmpfs", r, "tmpfs", MS_NOSUID, "size=1m,nr_inodes=4096,mode=755")
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
        sealed = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
        for mask in plan["masks"]:
            _mount("tmpfs", r + mask, "tmpfs", sealed, "size=4k,nr_inodes=16,mode=755")
        for link, dest in plan["links"]:
            os.makedirs(os.path.dirname(r + link), mode=0o755, exist_ok=True)
            if not os.path.lexists(r + link):
                os.symlink(dest, r + link)
        for name, dest in (
            ("fd", "/proc/self/fd"),
            ("stdin", "/proc/self/fd/0"),
            ("stdout", "/proc/self/fd/1"),
            ("stderr", "/proc/self/fd/2"),
        ):
            os.symlink(dest, f"{r}/dev/{name}")

    def build_root(self) -> None:
        """In B (root, pid 1 of fresh namespaces): the sample's root filesystem, then pivot_root: the
        slot's read-only template (copied with B's mount namespace) with a fresh /tmp, /dev/shm and
        /proc, or, without a template, the whole tree built here."""
        _mount(None, "/", None, MS_REC | MS_PRIVATE)  # first: nothing below may propagate to the host
        if self.template:
            r = self.template
        else:
            r = "/tmp" if os.path.isdir("/tmp") and not os.path.islink("/tmp") else "/mnt"
            self._read_only_tree(r)
        tmp_mb = int(self.s["tmpfs_mb"])
        for path, size in (("/tmp", tmp_mb), ("/dev/shm", max(1, tmp_mb // 4))):
            if not self.template:
                os.makedirs(r + path, mode=0o755, exist_ok=True)
            _mount("tmpfs", r + path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size}m,nr_inodes=4096,mode=1777")
        os.mkdir(r + WORKDIR)
        os.chmod(r + WORKDIR, 0o1777)
        if not self.template:
            os.makedirs(r + "/proc", mode=0o755, exist_ok=True)
        for options in ("hidepid=invisible,subset=pid", "hidepid=2", None):
            try:
                _mount("proc", r + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, options)
                break
            except OSError:
                if options is None:
                    raise
        if not self.template:
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
        program = self.seccomp_s if role == "s" else self.seccomp
        if program:
            _install_seccomp(program)
