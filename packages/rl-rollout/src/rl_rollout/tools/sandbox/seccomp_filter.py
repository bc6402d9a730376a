"""The sandbox's seccomp BPF filter, built with libseccomp (PyPI ``pyseccomp``).

Default allow, with a deny list of what sandboxed code never needs: debugging other
processes, (un)mounting, new namespaces, loading kernel code or BPF, the key store,
``perf_event_open``, cross-process memory access, io_uring (whose operations bypass
seccomp), and process creation: ``fork``/``vfork`` and ``clone`` without ``CLONE_THREAD``
fail with EPERM, ``clone3`` with ENOSYS (its flags live in memory BPF cannot read; glibc
then falls back to ``clone``, so threads still work). With ``allow_subprocesses`` process
creation is allowed but a ``clone`` that asks for a new namespace is still refused.
System calls of another architecture (e.g. ``int 0x80`` on x86-64) kill the process.
"""

from __future__ import annotations

import errno
import os

CLONE_THREAD = 0x00010000
CLONE_NAMESPACE_FLAGS = (
    0x00000080,  # CLONE_NEWTIME
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
)
DENIED_SYSCALLS = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "mount",
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
    "unshare",
    "setns",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "bpf",
    "keyctl",
    "add_key",
    "request_key",
    "perf_event_open",
    "userfaultfd",
    "open_by_handle_at",
    "name_to_handle_at",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "syslog",
    "iopl",
    "ioperm",
    "settimeofday",
    "clock_settime",
    "adjtimex",
)
PROCESS_CREATION = ("fork", "vfork")


class SeccompUnavailableError(RuntimeError):
    """libseccomp or its Python binding is missing."""


def _seccomp():
    try:
        import pyseccomp
    except (ImportError, RuntimeError) as exc:  # RuntimeError: libseccomp.so not found
        raise SeccompUnavailableError(
            "the seccomp filter needs PyPI `pyseccomp` (rl-rollout[sandbox]) and Debian's "
            f"`libseccomp2`: {exc}"
        ) from exc
    return pyseccomp


def seccomp_available() -> str | None:
    """None when a filter can be built here, else why not."""
    try:
        _seccomp()
    except SeccompUnavailableError as exc:
        return str(exc)
    return None


def build_filter_fd(allow_subprocesses: bool) -> int:
    """A memfd holding the filter as raw BPF (what ``bwrap --seccomp FD`` reads)."""
    sc = _seccomp()
    flt = sc.SyscallFilter(sc.ALLOW)
    deny = sc.ERRNO(errno.EPERM)
    for name in DENIED_SYSCALLS:
        try:
            flt.add_rule(deny, name)
        except (OSError, ValueError):
            continue  # a syscall this architecture does not have
    flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    for flag in CLONE_NAMESPACE_FLAGS:
        flt.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    if not allow_subprocesses:
        flt.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_THREAD, 0))
        for name in PROCESS_CREATION:
            try:
                flt.add_rule(deny, name)
            except (OSError, ValueError):
                continue  # aarch64 has no fork/vfork syscalls, only clone
    fd = os.memfd_create("rl-sandbox-seccomp", 0)
    try:
        with os.fdopen(os.dup(fd), "wb") as f:
            flt.export_bpf(f)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
