"""The environment worker process (tasks/env_worker.py): how it is started, and that it does not
keep a copy of the trainer's memory."""

import os
import sys
from pathlib import Path

import pytest

from rollwise.tasks.env_worker import EnvWorker, start_method
from rollwise.tasks.envs import Calculator


def private_mb(pid: int) -> float:
    """Memory only ``pid`` holds (Private_Clean + Private_Dirty of /proc/<pid>/smaps_rollup), in MB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:])
    return sum(int(fields[k].split()[0]) for k in ("Private_Clean", "Private_Dirty")) / 1024


def test_an_importable_class_gets_a_fork_server_worker_a_local_one_a_fork():
    class Local(Calculator):
        pass

    assert start_method(Calculator) == "forkserver"
    assert start_method(Local) == "fork"  # not importable by name: only a copy of the trainer has it
    worker = EnvWorker(Local, timeout=30.0, max_chars=100)
    try:
        assert worker.open(worker.new_id(), {})[0] == "ok"
        eid = worker.new_id()
        worker.open(eid, {})
        assert worker.call(eid, "calculate", (), {"expression": "6*7"}) == ("ok", ("42", False))
    finally:
        worker.shutdown()


@pytest.mark.skipif(not Path(f"/proc/{os.getpid()}/smaps_rollup").exists(), reason="needs Linux /proc smaps_rollup")
def test_the_worker_does_not_keep_the_trainers_memory():
    """A forked worker keeps the old copy of every page the trainer writes after the fork (its
    weights and optimizer state, every step); the fork-server worker never had them."""
    ballast = bytearray(300 * 2**20)  # the trainer's 300 MB, written after the worker started
    worker = EnvWorker(Calculator, timeout=30.0, max_chars=100)
    try:
        eid = worker.new_id()
        assert worker.open(eid, {})[0] == "ok"
        for i in range(0, len(ballast), 4096):
            ballast[i] = 1
        assert worker.call(eid, "calculate", (), {"expression": "2*21"}) == ("ok", ("42", False))
        held = private_mb(worker._proc.pid)
        assert worker._proc.pid != os.getpid() and held < 100, f"the worker holds {held:.0f} MB of its own"
    finally:
        worker.shutdown()
        del ballast


def test_a_class_the_fresh_worker_cannot_load_falls_back_to_fork(tmp_path, monkeypatch):
    """A class importable here but not in a fresh process (its module is on this process's path only
    after it started) still gets a worker: a forked one."""
    (tmp_path / "late_env.py").write_text("from rollwise.tasks.envs import Calculator\n\n\nclass Late(Calculator):\n"
                                          "    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import late_env

    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])  # gone for a fresh process
    worker = EnvWorker(late_env.Late, timeout=30.0, max_chars=100)
    try:
        eid = worker.new_id()
        assert worker.open(eid, {})[0] == "ok" and worker.start_method == "fork"
        assert worker.call(eid, "calculate", (), {"expression": "6*7"}) == ("ok", ("42", False))
    finally:
        worker.shutdown()
        sys.modules.pop("late_env", None)
