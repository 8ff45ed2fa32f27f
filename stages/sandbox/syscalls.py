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
  particular, which no network namespace isolates; `ioctl(TIOCSTI)`.

Refusing keeps the process alive (the call fails with an error), so honest code that probes for a
feature gets an ordinary exception rather than a crash.
"""

from __future__ import annotations

import errno
import tempfile

DENIED = (
    "add_key", "keyctl", "request_key",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "perf_event_open", "userfaultfd",
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
    "unshare", "setns",
    "mount", "umount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount",
    "open_tree", "mount_setattr", "open_by_handle_at", "name_to_handle_at", "fanotify_init", "lookup_dcookie",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "create_module",
    "swapon", "swapoff", "reboot", "acct", "quotactl", "quotactl_fd", "syslog", "vhangup", "iopl", "ioperm",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname",
    "personality", "uselib", "nfsservctl", "move_pages", "migrate_pages",
)
CLONE_NEW_FLAGS = (0x00020000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x02000000)
"""CLONE_NEWNS, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWCGROUP."""
ALLOWED_FAMILIES = (1, 2, 10, 16)
"""AF_UNIX, AF_INET, AF_INET6, AF_NETLINK."""
TIOCSTI, TIOCLINUX = 0x5412, 0x541C

_cache: tuple[bytes | None, str] | None = None


def build() -> bytes:
    """The BPF program (struct sock_filter[], native byte order) for this machine's architecture."""
    import pyseccomp as sc

    f = sc.SyscallFilter(sc.ALLOW)
    deny = sc.ERRNO(errno.EPERM)
    for name in DENIED:
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
    with tempfile.TemporaryFile() as fh:
        f.export_bpf(fh)
        fh.seek(0)
        program = fh.read()
    if not program or len(program) % 8:
        raise OSError("libseccomp exported an empty or malformed program")
    return program


def program() -> tuple[bytes | None, str]:
    """(program, "") or (None, why it is unavailable); computed once per process."""
    global _cache
    if _cache is None:
        try:
            _cache = (build(), "")
        except Exception as exc:  # pyseccomp missing, libseccomp missing, an unknown architecture
            _cache = (None, f"{type(exc).__name__}: {exc}")
    return _cache
