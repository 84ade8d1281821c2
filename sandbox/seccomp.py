"""A seccomp deny-list for sandboxed programs, compiled by the system's libseccomp.

bubblewrap loads a classic-BPF program from a file descriptor (``--seccomp FD``) just before it
executes the command. We do not hand-assemble BPF: libseccomp (Debian ``libseccomp2``, already a
dependency of systemd and util-linux) compiles the rules, handles the architecture check (a
syscall made through a foreign ABI such as i386 ``int 0x80`` or x32 kills the thread instead of
slipping past the table) and exports the program. We reach it through ``ctypes`` so no Python
package is needed.

The list is a second layer. The namespaces and the dropped capabilities already make most of
these calls fail; the filter also closes the ones that work for an unprivileged user inside its
own namespaces (``ptrace`` of a sibling, ``process_vm_*``, ``userfaultfd``, ``io_uring``,
``perf_event_open``, the key ring, ``setsid``) and shrinks the kernel surface a local exploit
could use.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os

#: Refused with EPERM: debugging other processes, mounting, namespaces, kernel modules and
#: kexec, BPF, perf, the key ring, userfaultfd, raw I/O ports, clocks, swap, accounting.
DENIED_EPERM: tuple[str, ...] = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "setns",
    "unshare",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "open_by_handle_at",
    "name_to_handle_at",
    "iopl",
    "ioperm",
    "syslog",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "vhangup",
    # bwrap has already put the program in a session of its own. Where the kernel groups
    # CPU time by session (sched_autogroup, on by default in Debian), every new session is a
    # new scheduling group: a fork bomb that calls setsid() per child multiplies its CPU share.
    "setsid",
)
#: Refused with ENOSYS so that runtimes fall back quietly (libuv probes io_uring at start).
DENIED_ENOSYS: tuple[str, ...] = ("io_uring_setup", "io_uring_enter", "io_uring_register")

_SCMP_ACT_ALLOW = 0x7FFF0000
_SCMP_ACT_ERRNO_BASE = 0x00050000


class SeccompUnavailable(RuntimeError):
    """libseccomp is missing or refused to build the filter."""


def _action_errno(code: int) -> int:
    return _SCMP_ACT_ERRNO_BASE | (code & 0xFFFF)


def _load_library() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    except OSError as exc:
        raise SeccompUnavailable(f"libseccomp.so.2 not loadable: {exc}") from exc
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.restype = None
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_syscall_resolve_name.restype = ctypes.c_int
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    # The array form is not variadic, so the ctypes call matches the C ABI exactly.
    lib.seccomp_rule_add_array.restype = ctypes.c_int
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.c_void_p,
    ]
    lib.seccomp_export_bpf.restype = ctypes.c_int
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def _add_rules(lib: ctypes.CDLL, ctx: int, names: tuple[str, ...], action: int) -> None:
    for name in names:
        number = lib.seccomp_syscall_resolve_name(name.encode())
        if number < 0:
            continue  # not a syscall on this architecture (libseccomp's own table says so)
        rc = lib.seccomp_rule_add_array(ctx, action, number, 0, None)
        if rc != 0:
            raise SeccompUnavailable(f"seccomp_rule_add({name}) failed: {os.strerror(-rc)}")


def _export(lib: ctypes.CDLL, ctx: int) -> bytes:
    fd = os.memfd_create("loopwright-seccomp-export", os.MFD_CLOEXEC)
    try:
        rc = lib.seccomp_export_bpf(ctx, fd)
        if rc != 0:
            raise SeccompUnavailable(f"seccomp_export_bpf failed: {os.strerror(-rc)}")
        os.lseek(fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


@functools.cache
def deny_filter_bpf() -> bytes:
    """The compiled filter (classic BPF for the native architecture), built once per process."""
    lib = _load_library()
    ctx = lib.seccomp_init(_SCMP_ACT_ALLOW)
    if not ctx:
        raise SeccompUnavailable("seccomp_init failed")
    try:
        _add_rules(lib, ctx, DENIED_EPERM, _action_errno(errno.EPERM))
        _add_rules(lib, ctx, DENIED_ENOSYS, _action_errno(errno.ENOSYS))
        return _export(lib, ctx)
    finally:
        lib.seccomp_release(ctx)


def filter_fd() -> int:
    """A fresh descriptor positioned at the start of the filter, for one bwrap ``--seccomp``.

    bwrap reads the descriptor to its end, so every run needs its own. The caller closes it
    after the child has been spawned.
    """
    return memfd_with("loopwright-seccomp", deny_filter_bpf())


def memfd_with(name: str, data: bytes) -> int:
    """An anonymous in-memory file holding ``data``, positioned at its start (close-on-exec:
    only descriptors listed in ``pass_fds`` reach the child)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
