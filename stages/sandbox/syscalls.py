"""The syscall filter for the solution's and the judge's processes, built with libseccomp.

Built once per parent process with `pyseccomp` (ctypes bindings to the system's libseccomp) and
exported as a raw BPF program; the sandbox server installs it with prctl, so nothing inside the
sandbox needs libseccomp. Default: allow. Refused with EPERM (what test code never needs, and what
would reach past the sandbox or carry data between samples):

- kernel keyrings (`add_key`, `keyctl`, `request_key`): keys outlive processes and are shared by uid;
- `io_uring_*`, `bpf`, `perf_event_open`, `userfaultfd`: large kernel attack surface;
- `ptrace`, `process_vm_readv/writev`, `pidfd_getfd`, `kcmp`: reading or steering other processes;
- new namespaces (`unshare`, `setns`, `clone` with a CLONE_NEW* flag; `clone3` answers ENOSYS so
  that the C library falls back to `clone`, whose flags the filter can see);
- mounts (`mount`, `umount2`, `pivot_root`, `chroot`, the new mount API), `open_by_handle_at`,
  `name_to_handle_at`, `fanotify_init`;
- the machine's state: kexec, kernel modules, swap, reboot, clocks, hostname, `acct`, `quotactl`,
  `syslog`, `iopl`/`ioperm`, `personality`, `vhangup`;
- sockets of any family other than unix, IPv4, IPv6 and netlink (EAFNOSUPPORT): vsock in
  particular, which no network namespace isolates; `ioctl(TIOCSTI)`;
- the page cache's state, read or steered without timing: `fadvise64`, `readahead`, `mincore`,
  `cachestat`, `preadv2`/`pwritev2` with RWF_NOWAIT, `madvise` with MADV_WILLNEED, MADV_COLD or
  MADV_PAGEOUT. The files every sample shares (the standard library, the shared libraries) are cached
  by the host for all of them; a sample that could set and read which of their pages are cached could
  leave bits for the next sample. What remains is timing (a cached read is faster): not isolated.

The solution's process (`role="s"`) may also make no symbolic links (`symlink`, `symlinkat`): it
shares a working folder with the judge, and a symbolic link there could turn a write of the judge's
into a write elsewhere (its own result pipe, through /proc/self/fd). Hard links stay (POSIX semaphores,
a multiprocessing.Pool's, are made with one): they can only name a file of the same tmpfs that S could
already reach, never a pipe or a /proc file.

Refusing keeps the process alive (the call fails with an error), so honest code that probes for a
feature gets an ordinary exception rather than a crash.
"""

from __future__ import annotations

import errno
import tempfile

DENIED = (
    "add_key",
    "keyctl",
    "request_key",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "kcmp",
    "unshare",
    "setns",
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "chroot",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "open_by_handle_at",
    "name_to_handle_at",
    "fanotify_init",
    "lookup_dcookie",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "swapon",
    "swapoff",
    "reboot",
    "acct",
    "quotactl",
    "quotactl_fd",
    "syslog",
    "vhangup",
    "iopl",
    "ioperm",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "sethostname",
    "setdomainname",
    "personality",
    "uselib",
    "nfsservctl",
    "move_pages",
    "migrate_pages",
)
CLONE_NEW_FLAGS = (0x00020000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x02000000)
"""CLONE_NEWNS, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWCGROUP."""
ALLOWED_FAMILIES = (1, 2, 10, 16)
"""AF_UNIX, AF_INET, AF_INET6, AF_NETLINK."""
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
PAGE_CACHE = ("fadvise64", "fadvise64_64", "arm_fadvise64_64", "readahead", "mincore", "cachestat")
RWF_NOWAIT = 0x8
MADVISE_DENIED = (3, 20, 21)
"""MADV_WILLNEED, MADV_COLD, MADV_PAGEOUT."""
LINKS = ("symlink", "symlinkat")

_cache: dict[str, tuple[bytes | None, str]] = {}


def build(role: str = "j") -> bytes:
    """The BPF program (struct sock_filter[], native byte order) for this machine's architecture, for the
    judge (`role="j"`) or the solution (`"s"`)."""
    import pyseccomp as sc

    f = sc.SyscallFilter(sc.ALLOW)
    deny = sc.ERRNO(errno.EPERM)
    for name in DENIED + PAGE_CACHE + (LINKS if role == "s" else ()):
        try:
            f.add_rule(deny, name)
        except (OSError, ValueError):  # not a syscall on this architecture
            pass
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    for flag in CLONE_NEW_FLAGS:
        f.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    for family in range(64):
        if family not in ALLOWED_FAMILIES:
            f.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), "socket", sc.Arg(0, sc.MASKED_EQ, 0xFFFFFFFF, family))
    for request in (TIOCSTI, TIOCLINUX):
        f.add_rule(deny, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
    for name in ("preadv2", "pwritev2"):
        try:
            f.add_rule(deny, name, sc.Arg(5, sc.MASKED_EQ, RWF_NOWAIT, RWF_NOWAIT))
        except (OSError, ValueError):
            pass
    for advice in MADVISE_DENIED:
        f.add_rule(deny, "madvise", sc.Arg(2, sc.MASKED_EQ, 0xFFFFFFFF, advice))
    with tempfile.TemporaryFile() as fh:
        f.export_bpf(fh)
        fh.seek(0)
        program = fh.read()
    if not program or len(program) % 8:
        raise OSError("libseccomp exported an empty or malformed program")
    return program


def program(role: str = "j") -> tuple[bytes | None, str]:
    """(program, "") or (None, why it is unavailable); computed once per process and role."""
    if role not in _cache:
        try:
            _cache[role] = (build(role), "")
        except Exception as exc:  # pyseccomp missing, libseccomp missing, an unknown architecture
            _cache[role] = (None, f"{type(exc).__name__}: {exc}")
    return _cache[role]
