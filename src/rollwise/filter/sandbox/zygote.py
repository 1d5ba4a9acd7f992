"""The worker that runs inside the sandbox: a warm interpreter that forks one child per job.

This file is run as ``python -I -S -c <this source>`` by the sandbox's interpreter (which may
be a different Python than the grader's), so it uses the standard library only and never
imports rollwise. It talks to the pool over its stdin/stdout with length-prefixed JSON:

1. the pool sends an init message (seccomp program, work directory, how to kill leftovers);
   the worker loads the seccomp filter, becomes a child subreaper and non-dumpable, replies
   ``{"ready": ...}``;
2. then for each job ``{code, stdin, timeout_s, memory_mb, ...}`` it compiles the code, forks
   a child that sets the job's rlimits, runs the code object with ``exec`` (no interpreter
   start-up: this is why the pool is fast) and exits; the worker feeds stdin, collects stdout/stderr up to the output
   cap, enforces the wall-clock timeout, then kills every process the job left behind, reaps
   them, wipes the writable directories and replies with the result.

Why the worker cannot be killed by the job: under bubblewrap it is PID 1 of its own PID
namespace (``--as-pid-1``), and the kernel drops SIGKILL/SIGSTOP sent to a namespace's init
from inside it, so ``os.kill(os.getppid(), 9)`` and ``kill(-1, 9)`` from a job do nothing to it.
Being non-dumpable keeps ``/proc/1/mem`` closed to jobs of the same uid.
"""

import ctypes
import gc
import json
import linecache
import math
import os
import resource
import select
import shutil
import signal
import struct
import sys
import time

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER = 1, 4, 22, 38, 36
SECCOMP_MODE_FILTER = 2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def prctl(option, arg=0):
    if _libc.prctl(option, arg, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}): {os.strerror(err)}")


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def load_seccomp(bpf):
    """Install a classic-BPF seccomp filter (``struct sock_filter`` array bytes) on this process."""
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    buf = ctypes.create_string_buffer(bpf, len(bpf))
    prog = _SockFprog(len(bpf) // 8, ctypes.addressof(buf))
    _libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    try:
        if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, "seccomp: " + os.strerror(err))
    finally:
        _libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def read_exact(fd, n):
    chunks, got = [], 0
    while got < n:
        data = os.read(fd, n - got)
        if not data:
            return None
        chunks.append(data)
        got += len(data)
    return b"".join(chunks)


def recv(fd):
    head = read_exact(fd, 4)
    if head is None:
        return None
    body = read_exact(fd, struct.unpack(">I", head)[0])
    return None if body is None else json.loads(body.decode("utf-8"))


def send(fd, obj):
    body = json.dumps(obj).encode("utf-8")
    data = struct.pack(">I", len(body)) + body
    while data:
        data = data[os.write(fd, data):]


def child_pids():
    """Our direct children (orphans re-parented to us included: we are a subreaper)."""
    pids = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                pids.extend(int(p) for p in f.read().split())
        except OSError:
            pass
    return pids


def kill_everything(kill_all_uid):
    """SIGKILL every process the job left, until none is left; returns {pid: wait status}.

    ``kill(-1)`` reaches every process we may signal except ourselves (and, in a PID namespace,
    only that namespace): with a dedicated uid or our own PID namespace, that is exactly the
    job's processes. Otherwise (same uid as the grader, no namespace) we walk our children,
    which under the subreaper include re-parented orphans; each round re-reads them, so a fork
    bomb is chased down until the process limit stops it from growing.
    """
    statuses = {}
    for _ in range(100000):
        if kill_all_uid:
            try:
                os.kill(-1, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        else:
            for pid in child_pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return statuses
            if pid == 0:
                break
            statuses[pid] = status
        time.sleep(0.0002)
    return statuses


def wipe(dirs):
    for d in dirs:
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            path = os.path.join(d, name)
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    os.unlink(path)
            except OSError:
                pass


def limits_for(job):
    """The run's rlimits as (resource, soft, hard); soft == hard except CPU (SIGXCPU, then SIGKILL)."""
    cpu = math.ceil(job["timeout_s"]) + 1
    return [
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_AS, job["memory_mb"] << 20, job["memory_mb"] << 20),
        (resource.RLIMIT_FSIZE, job["file_mb"] << 20, job["file_mb"] << 20),
        (resource.RLIMIT_NOFILE, job["open_files"], job["open_files"]),
        (resource.RLIMIT_NPROC, job["processes"], job["processes"]),
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_MEMLOCK, 0, 0),
        (resource.RLIMIT_MSGQUEUE, 0, 0),
    ]


def prepare_process(workdir):
    """Once per worker: what every run shares (cwd, environment, stdio objects, argv, sys.path).

    Done here rather than in each child because every page a forked child writes is copied
    (copy-on-write faults are most of a run's cost), so the child's own work is kept minimal.
    """
    os.chdir(workdir)
    os.environ.clear()
    os.environ.update({"PATH": "/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8"})
    # new stdio objects on fds 0-2: a child dup2()s its pipes onto those fds; the worker itself
    # never reads or writes them (it talks to the pool on other fds), so their buffers stay empty
    sys.stdin = open(0, "r", encoding="utf-8", errors="replace", closefd=False)
    sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1)
    sys.argv = ["solution.py"]
    sys.path[0:0] = [workdir]
    # a job may signal the worker; as PID 1 of a namespace it only receives signals it handles,
    # so drop Python's SIGINT handler (KeyboardInterrupt) and keep every signal at its default
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def prepare_run(job):
    """In the worker, before fork: the run's __main__ module, its source for tracebacks, its limits."""
    # tracebacks quote the source from linecache, so no file needs writing (a write costs more than the run)
    linecache.cache["solution.py"] = (len(job["code"]), None, job["code"].splitlines(True), "solution.py")
    module = type(sys)("__main__")
    module.__file__ = "solution.py"
    module.__builtins__ = __builtins__
    # compiled here, not in the child: the compiler writes to ~200 pages a child would each have
    # to copy. Compiling cannot run the code; a pathological source at worst crashes or stalls this
    # worker, which the pool then kills and replaces. A syntax error is raised in the child.
    try:
        code = compile(job["code"], "solution.py", "exec")
    except BaseException as err:  # SyntaxError, ValueError (NUL bytes), RecursionError, MemoryError
        code = err.with_traceback(None)
    return module, code, limits_for(job)


def run_child(module, code, limits, fds):
    """In the forked child: become the job, run its code, exit. Never returns."""
    status = 111
    try:
        in_r, out_w, err_w = fds
        os.setsid()
        os.dup2(in_r, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, 1 << 16)  # the pool's pipes included: a job must not forge replies
        for which, soft, hard in limits:
            resource.setrlimit(which, (soft, hard))  # hard limits can only go down without privileges
        sys.modules["__main__"] = module
        status = 0
        try:
            if isinstance(code, BaseException):
                raise code
            exec(code, module.__dict__)
        except SystemExit as e:
            if e.code is None:
                status = 0
            elif isinstance(e.code, int):
                status = e.code & 0xFF
            else:
                status = 1  # before reporting: a report that fails (a broken sys.stderr) is still a failure
                sys.stderr.write(str(e.code) + "\n")
        except BaseException as err:
            status = 1  # before the traceback: printing it may fail too (sys.stderr replaced, no memory left)
            import traceback

            # from the program's first frame on (the worker's own frame is not the program's business)
            tb = None if isinstance(code, BaseException) else err.__traceback__.tb_next
            traceback.print_exception(type(err), err, tb)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
    finally:
        os._exit(status)


def describe_status(status):
    """(returncode, reason) of a wait status; returncode < 0 is a signal, as in subprocess."""
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        return code, ""
    sig = -code
    name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
    if sig == signal.SIGXCPU:
        return code, f"CPU time limit exceeded ({name})"
    return code, f"killed by {name}"


def pump(pid, pidfd, bufs, readers, writers, stdin, deadline, job):
    """Feed stdin and collect output until the child exits, the deadline passes or output overflows.

    Returns (wait status or None, reason, timed_out, writers still open).
    """
    sent, cap = 0, job["output_bytes"]
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None, f"timed out after {job['timeout_s']:g}s (wall clock)", True, writers
        ready_r, ready_w, _ = select.select(readers, writers, [], remaining)
        if ready_w:
            try:
                sent += os.write(writers[0], stdin[sent:sent + 65536])
            except BlockingIOError:
                pass
            except BrokenPipeError:  # the program stopped reading: the rest of stdin is dropped
                sent = len(stdin)
            if sent >= len(stdin):
                os.close(writers[0])
                writers = []
        status = None
        for fd in ready_r:
            if fd == pidfd:
                status = os.waitpid(pid, 0)[1]
                continue
            data = os.read(fd, 65536)
            if not data:
                readers.remove(fd)
            bufs[fd] += data
        if sum(map(len, bufs.values())) > cap:
            return status, f"output limit exceeded ({cap} bytes)", False, writers
        if status is not None:
            return status, "", False, writers


def drain(bufs, readers, cap):
    """Read what is left in the pipes (every writer is dead by now), still within the cap."""
    for fd in bufs:
        while fd in readers and sum(map(len, bufs.values())) <= cap:
            r, _, _ = select.select([fd], [], [], 0.5)
            data = os.read(fd, 65536) if r else b""
            if not data:
                break
            bufs[fd] += data
        os.close(fd)


def run_job(job, init):
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    module, code, limits = prepare_run(job)
    # what the worker needs while the run is alive is allocated before fork: after it, every
    # page the worker writes takes a copy-on-write fault
    cap = job["output_bytes"]
    bufs = {out_r: bytearray(), err_r: bytearray()}
    stdin = job["stdin"].encode("utf-8", "replace")  # lone surrogates become "?"
    os.set_blocking(in_w, False)
    readers, writers = [out_r, err_r], [in_w] if stdin else []
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        run_child(module, code, limits, (in_r, out_w, err_w))
    for fd in (in_r, out_w, err_w):
        os.close(fd)
    if not stdin:
        os.close(in_w)
    pidfd = os.pidfd_open(pid)
    readers.append(pidfd)
    status, reason, timed_out, writers = pump(pid, pidfd, bufs, readers, writers, stdin, start + job["timeout_s"], job)
    leftovers = kill_everything(init["kill_all_uid"])
    if status is None:
        status = leftovers.get(pid)
    for fd in writers:
        os.close(fd)
    drain(bufs, readers, cap)
    os.close(pidfd)
    wipe(init["writable"])
    returncode, why = describe_status(status) if status is not None else (-9, "")
    if timed_out or reason:
        returncode = -9 if timed_out or status is None else returncode
    elif sum(map(len, bufs.values())) > cap:
        reason = f"output limit exceeded ({cap} bytes)"
    return {
        "returncode": returncode,
        "stdout": bytes(bufs[out_r][:cap]).decode("utf-8", "replace"),
        "stderr": bytes(bufs[err_r][:cap]).decode("utf-8", "replace"),
        "timed_out": timed_out,
        "reason": reason or why,
        "wall_s": time.monotonic() - start,
    }


def main():
    proto_in, proto_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    init = recv(proto_in)
    if init is None:
        return
    prepare_process(init["workdir"])
    layers = []
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    prctl(PR_SET_DUMPABLE, 0)
    if init.get("parent_death"):
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if init.get("seccomp_hex"):
        load_seccomp(bytes.fromhex(init["seccomp_hex"]))
        layers.append("seccomp")
    gc.collect()
    gc.freeze()  # forked children then never touch these objects' GC headers: fewer copy-on-write pages
    send(proto_out, {"ready": True, "pid": os.getpid(), "uid": os.getuid(), "layers": layers,
                     "python": sys.version.split()[0]})
    while True:
        job = recv(proto_in)
        if job is None:
            return
        send(proto_out, run_job(job, init))
        del job


if __name__ == "__main__":
    main()
