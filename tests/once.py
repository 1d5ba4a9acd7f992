"""A session fixture's files built once per test run, however many pytest-xdist workers ask for them.

``make test`` runs the suite on worker processes (``-n 2``); a session fixture runs once per worker,
so an expensive one (the SFT warm start) would be built by each. ``once`` builds it in the run's
temporary root, shared by its workers, under a file lock: the first to ask builds, the others wait
for it and reuse the directory, and nobody ever reads a half-written one.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock


def shared_root(tmp_path_factory) -> Path:
    """The run's temporary root: the same directory for every worker of one run (a worker's own is
    ``<root>/popen-gwN``), a new one for each run (pytest numbers them), the basetemp without xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once(root: Path, name: str, build: Callable[[Path], None]) -> Path:
    """``root/name``, made by ``build(root/name)`` the first time any process asks. A process asking
    while another builds waits for it; a build that raised is started afresh by the next to ask."""
    out, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)
            build(out)
            done.touch()
    return out
