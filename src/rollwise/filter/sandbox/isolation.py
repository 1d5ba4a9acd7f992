"""What isolation this machine offers, and the command line that starts one sandboxed worker.

Layers, outermost first (see ``docs/sandbox.md``):

- **uid**: as root, each worker runs as its own unprivileged uid (no passwd entry, no groups,
  no capabilities), claimed for the pool's lifetime with an abstract-socket lock so two pools
  on one machine never share one. Without root, workers keep the caller's uid.
- **bubblewrap** (``bwrap``), started *after* the uid drop, so it runs unprivileged inside a
  new user namespace: every namespace unshared (user, pid, net, ipc, uts, cgroup), an empty
  read-only root with only ``/usr`` (and the interpreter's prefix) bound read-only, a private
  size-capped ``/tmp``, a fresh ``/proc`` and minimal ``/dev``, a new session, cleared
  environment, ``--die-with-parent``, ``--as-pid-1``. Hidden tests and datasets live outside
  what is bound, so they are not readable from inside.
- **seccomp** (``seccomp.py``), loaded by the worker before its first job.
- **rlimits**, **wall-clock timeout**, **output cap**, **subreaper + kill of every leftover
  process**: always on (``zygote.py``); they need nothing from the machine.

``isolation: full`` needs the first three; ``best_effort`` uses what is there and warns.
"""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from rollwise.config import ConfigError
from rollwise.filter.sandbox.seccomp import seccomp_available

PROBE_TIMEOUT_S = 20


class SandboxUnavailable(ConfigError):
    """The requested isolation cannot be provided here; the message says what is missing and the fix."""


@dataclass
class Isolation:
    """What was detected. ``layers`` is what a pool will use; ``missing`` what full isolation lacks."""

    root: bool
    python: str | None
    python_note: str
    bwrap: str | None
    bwrap_note: str
    seccomp: bool
    seccomp_note: str
    bwrap_args: list[str] = field(default_factory=list)

    @property
    def layers(self) -> list[str]:
        found = ["uid"] if self.root else []
        found += ["bubblewrap"] if self.bwrap else []
        found += ["seccomp"] if self.seccomp else []
        return found + ["rlimits", "timeout", "output cap", "subreaper"]

    @property
    def missing(self) -> list[str]:
        out = []
        if not self.root:
            out.append("separate uid per worker: needs root (workers keep your uid)")
        if not self.bwrap:
            out.append(f"bubblewrap: {self.bwrap_note}")
        if not self.seccomp:
            out.append(f"seccomp: {self.seccomp_note}")
        return out

    def describe(self) -> str:
        lines = [f"sandbox layers: {', '.join(self.layers)}", f"  interpreter: {self.python or '-'} ({self.python_note})"]
        if self.bwrap:
            lines.append(f"  bubblewrap: {self.bwrap_note}")
        if self.seccomp:
            lines.append(f"  seccomp: {self.seccomp_note}")
        lines += [f"  missing: {m}" for m in self.missing]
        return "\n".join(lines)


def claim_uid(start: int, taken: set[int] = frozenset()) -> tuple[int, socket.socket]:
    """A uid >= ``start`` with no passwd entry that no other live pool holds, and its lock.

    The lock is an abstract Unix socket named after the uid: machine-wide (per network
    namespace), no file written, released by the kernel when its holder exits.
    """
    for uid in range(start, start + 100_000):
        if uid in taken:
            continue
        try:
            pwd.getpwuid(uid)
            continue  # a real account: never run untrusted code as it
        except KeyError:
            pass
        lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            lock.bind(f"\0rollwise-sandbox-uid-{uid}")
            return uid, lock
        except OSError:
            lock.close()
    raise SandboxUnavailable(f"no free uid in {start}..{start + 100_000}; set sandbox.uid_base elsewhere")


def drop_kwargs(uid: int | None) -> dict:
    """``subprocess`` arguments that switch to ``uid`` (and gid ``uid``, no groups) in the child."""
    return {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}


def _candidates(python: str) -> list[str]:
    if python != "auto":
        return [python]
    found = [os.path.realpath(getattr(sys, "_base_executable", sys.executable)), os.path.realpath(sys.executable)]
    found += [p for p in (shutil.which("python3"), "/usr/bin/python3") if p]
    return list(dict.fromkeys(found))


def _runs_as(python: str, uid: int | None) -> str:
    """'' if ``python -I -S`` starts as ``uid``, else why not."""
    try:
        r = subprocess.run([python, "-I", "-S", "-c", "import json, ctypes, resource, select"], capture_output=True,
                           timeout=PROBE_TIMEOUT_S, env={}, cwd="/", check=False, **drop_kwargs(uid))
    except (OSError, subprocess.SubprocessError) as err:
        return f"{type(err).__name__}: {err}"
    return "" if r.returncode == 0 else (r.stderr.decode(errors="replace").strip().splitlines() or ["failed"])[-1]


def choose_python(python: str, uid: int | None) -> tuple[str | None, str]:
    """The first candidate interpreter the sandbox uid can run, with a note saying why."""
    why = []
    for candidate in _candidates(python):
        problem = _runs_as(candidate, uid)
        if not problem:
            return candidate, "runs as the sandbox uid" if uid is not None else "runs as this user"
        why.append(f"{candidate}: {problem}")
    return None, ("no usable interpreter (" + "; ".join(why) + "); set sandbox.python (task.sandbox.python in a training recipe) to one every user "
                  "can read, e.g. /usr/bin/python3 (apt-get install -y python3)")


def _python_prefix(python: str) -> str:
    return str(Path(python).resolve().parent.parent)


def bwrap_args(bwrap: str, python: str, tmpfs_mb: int) -> list[str]:
    """bubblewrap's command line up to (not including) the command it runs."""
    args = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--as-pid-1", "--clearenv",
            "--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64"):
        path = Path("/") / top
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    prefix = _python_prefix(python)
    if not (prefix + "/").startswith("/usr/"):
        args += ["--ro-bind", prefix, prefix]
    args += ["--proc", "/proc", "--dev", "/dev", "--size", str(tmpfs_mb << 20), "--tmpfs", "/tmp",
             "--size", str(1 << 20), "--tmpfs", "/dev/shm", "--chdir", "/tmp", "--remount-ro", "/"]
    return args


def _probe_bwrap(bwrap: str, python: str, uid: int | None, tmpfs_mb: int) -> str:
    """'' if a sandboxed interpreter starts and sees itself unprivileged, else why not."""
    check = "import os; assert os.getpid() == 1; open('/tmp/x', 'w').write('ok'); print(os.getuid())"
    try:
        r = subprocess.run([*bwrap_args(bwrap, python, tmpfs_mb), python, "-I", "-S", "-c", check],
                           capture_output=True, timeout=PROBE_TIMEOUT_S, check=False, **drop_kwargs(uid))
    except (OSError, subprocess.SubprocessError) as err:
        return f"{type(err).__name__}: {err}"
    if r.returncode != 0:
        return (r.stderr.decode(errors="replace").strip() or f"exit status {r.returncode}")[-300:]
    if uid is not None and r.stdout.strip() != str(uid).encode():
        return f"sandboxed uid is {r.stdout.strip()!r}, expected {uid}"
    return ""


@functools.lru_cache(maxsize=8)
def detect(python: str = "auto", uid_base: int = 61000, tmpfs_mb: int = 64) -> Isolation:
    """Probe this machine (cached per process): root, interpreter, bubblewrap, seccomp."""
    root = os.geteuid() == 0
    probe_uid, lock = claim_uid(uid_base) if root else (None, None)
    try:
        chosen, python_note = choose_python(python, probe_uid)
        seccomp, seccomp_note = seccomp_available()
        path, note = shutil.which("bwrap"), ""
        if path is None:
            note = "not installed (apt-get install -y bubblewrap)"
        elif chosen is None:
            note, path = "not probed: no usable interpreter", None
        else:
            problem = _probe_bwrap(path, chosen, probe_uid, tmpfs_mb)
            if problem:
                note, path = f"{path} does not work here: {problem}", None
            else:
                version = subprocess.run([path, "--version"], capture_output=True, text=True, check=False).stdout.strip()
                note = f"{version or path}, all namespaces unshared"
        return Isolation(root=root, python=chosen, python_note=python_note, bwrap=path, bwrap_note=note,
                         seccomp=seccomp, seccomp_note=seccomp_note)
    finally:
        if lock is not None:
            lock.close()
