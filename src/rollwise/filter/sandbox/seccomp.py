"""The sandbox's seccomp filter, compiled to a classic-BPF program with libseccomp.

We build the filter here, in the trusted grader, with ``pyseccomp`` (a ctypes binding of the
system's libseccomp, so nothing is compiled at install time) and export the BPF bytes. The
worker inside the sandbox loads those bytes itself with ``prctl(PR_SET_SECCOMP)`` before it
runs any job (``zygote.py``), so the sandboxed interpreter never needs the binding.

The filter is a deny-list returning ``EPERM`` (``ENOSYS`` for ``clone3``), so hostile code sees
ordinary errors rather than being killed mid-write, and the grader can still report what it
printed. Syscalls of other architectures (e.g. the x32 ABI) kill the process: libseccomp's
default for a foreign architecture.
"""

from __future__ import annotations

import errno
import logging
import tempfile

log = logging.getLogger(__name__)

# Nothing a grading job needs: tracing, kernel/module/mount/namespace control, keyrings, BPF,
# perf, io_uring (its own syscall surface, bypassing this filter), raw device nodes, clock and
# accounting changes, handle-based opens (escape from bind mounts).
DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsmount", "fsconfig", "fspick",
    "mount_setattr", "unshare", "setns",
    "bpf", "perf_event_open", "userfaultfd", "fanotify_init", "lookup_dcookie",
    "keyctl", "add_key", "request_key",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot",
    "swapon", "swapoff", "syslog", "acct", "quotactl", "vhangup", "iopl", "ioperm",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "open_by_handle_at", "name_to_handle_at",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "mknod", "mknodat", "personality",
)
# clone flags that create namespaces: a job must not build itself a new user namespace (where
# it would hold every capability again) or any other
NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
AF_UNIX = 1


def seccomp_available() -> tuple[bool, str]:
    """(usable, what was found or why not)."""
    try:
        import pyseccomp
    except ImportError:
        return False, "the 'pyseccomp' package is not installed (pip install pyseccomp)"
    except OSError as err:  # the binding loads libseccomp.so.2 when imported
        return False, f"libseccomp could not be loaded ({err}); apt-get install -y libseccomp2"
    try:
        build_bpf()
    except Exception as err:
        return False, f"libseccomp failed to build a filter ({type(err).__name__}: {err})"
    return True, f"libseccomp via pyseccomp (API level {pyseccomp.get_api()})"


def build_bpf() -> bytes:
    """The filter as BPF bytes (``struct sock_filter`` array) for ``prctl(PR_SET_SECCOMP)``."""
    import pyseccomp as sc

    filt = sc.SyscallFilter(sc.ALLOW)
    for name in DENIED:
        try:
            filt.add_rule(sc.ERRNO(errno.EPERM), name)
        except (OSError, ValueError, RuntimeError):  # a syscall this libseccomp/arch does not know
            log.debug("seccomp: syscall %s unknown here, not filtered", name)
    # only Unix sockets (socketpair, multiprocessing); the network namespace has no route out
    # anyway, this also closes netlink, packet and loopback IP sockets
    filt.add_rule(sc.ERRNO(errno.EPERM), "socket", sc.Arg(0, sc.NE, AF_UNIX))
    for flag in NAMESPACE_FLAGS.values():
        filt.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    # clone3 passes its flags in memory a filter cannot read: ENOSYS makes libc fall back to clone
    filt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as f:
        filt.export_bpf(f)
        f.seek(0)
        data = f.read()
    if not data or len(data) % 8:
        raise RuntimeError(f"libseccomp exported {len(data)} bytes of BPF (not whole 8-byte instructions)")
    return data
