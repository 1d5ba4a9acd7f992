"""The sandbox: hostile programs are contained and the test process is unaffected.

These run as root on the project's machines, so every check that the sandbox blocks a write
targets a path that only exists inside the sandbox's own throwaway filesystem or a temporary
directory the test created — nothing outside it is ever touched, even if a layer failed.
"""

import os
import resource
import socket
import threading

import pytest

from rollwise.config import ConfigError
from rollwise.filter.sandbox import Job, SandboxConfig, SandboxPool, SandboxUnavailable, detect

FAST = SandboxConfig(workers=2, timeout_s=3.0, memory_mb=256, max_output_bytes=100_000, max_processes=24)


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(FAST) as p:
        yield p


def test_full_isolation_is_detected_here():
    iso = detect()
    assert iso.missing == [], iso.describe()  # CI installs bubblewrap and pyseccomp; root drops to a uid
    assert {"uid", "bubblewrap", "seccomp"} <= set(iso.layers)


def test_runs_code_with_stdin_and_reports_exit_status(pool):
    r = pool.run("import sys\nn = int(input())\nprint(n * 2)\nsys.exit(3)", stdin="21\n")
    assert (r.returncode, r.stdout, r.timed_out, r.reason) == (3, "42\n", False, "")
    r = pool.run("raise ValueError('boom')")
    assert r.returncode == 1 and "ValueError: boom" in r.stderr and 'line 1' in r.stderr
    r = pool.run("def f(:")
    assert r.returncode == 1 and "SyntaxError" in r.stderr


def test_unprivileged_uid_no_capabilities_no_network_pid1_elsewhere(pool):
    code = (
        "import os\nst = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines())\n"
        "print(os.getuid(), os.getgid(), os.getgroups(), st['CapEff'].strip(), st['CapBnd'].strip(),"
        " st['NoNewPrivs'].strip(), st['Seccomp'].strip(), sorted(os.listdir('/')))"
    )
    r = pool.run(code)
    uid, gid, groups, cap_eff, cap_bnd, nnp, seccomp, *_ = r.stdout.split(maxsplit=7)
    assert int(uid) in pool.uids and int(uid) != 0 and int(gid) != 0 and groups == "[]"
    assert cap_eff == cap_bnd == "0000000000000000" and nnp == "1" and seccomp == "2"
    assert "root" not in r.stdout and "work" not in r.stdout and "home" not in r.stdout


def test_infinite_loop_is_stopped_by_the_wall_clock(pool):
    r = pool.run("while True: pass", timeout_s=0.5)
    assert r.timed_out and r.returncode == -9 and "timed out" in r.reason and r.wall_s < 3


def test_fork_bomb_is_bounded_by_the_process_limit_and_killed(pool):
    code = "import os\nn = 0\nwhile True:\n    try:\n        os.fork(); n += 1\n    except OSError:\n        print('limit', n, flush=True); break\nimport time; time.sleep(60)\n"
    before = len(os.listdir("/proc"))
    r = pool.run(code, timeout_s=1.0)
    assert r.timed_out and "limit" in r.stdout  # forks failed at RLIMIT_NPROC, not by luck
    assert max(int(line.split()[1]) for line in r.stdout.splitlines()) < FAST.max_processes
    assert pool.run("print('alive')").stdout == "alive\n"
    assert len(os.listdir("/proc")) < before + 10  # nothing left behind on the host


def test_memory_and_recursion(pool):
    r = pool.run("x = bytearray(8 * 1024**3)\nprint('allocated')")
    assert r.returncode == 1 and "MemoryError" in r.stderr and "allocated" not in r.stdout
    r = pool.run("import sys\nsys.setrecursionlimit(10**7)\ndef f(n): return f(n + 1)\nf(0)")
    assert r.returncode != 0 and not r.ok  # C stack overflow (SIGSEGV) or RecursionError, contained
    assert pool.run("print(1)").ok


def test_a_failing_program_whose_traceback_cannot_be_printed_still_fails(pool):
    """The exit status is a failure before the report is written: a program that raised and broke
    sys.stderr (or ran out of memory while its traceback was printed) never reads as success."""
    r = pool.run("import sys\nsys.stderr = object()\nraise ValueError('x')")
    assert r.returncode == 1 and not r.ok
    r = pool.run("import sys\nsys.stderr = object()\nsys.exit('bye')")
    assert r.returncode == 1 and not r.ok


def test_big_file_and_big_output_are_capped(pool):
    r = pool.run("f = open('big', 'wb')\nfor _ in range(1024):\n    f.write(b'x' * 1024**2)\n", timeout_s=5)
    assert r.returncode == 1 and ("File too large" in r.stderr or "No space" in r.stderr)
    r = pool.run("import sys\nsys.stdout.write('y' * (100 * 1024**2))", timeout_s=5)
    assert "output limit" in r.reason and len(r.stdout) <= FAST.max_output_bytes and r.wall_s < 5


def test_no_network_not_even_loopback(pool):
    host = socket.socket()
    host.bind(("127.0.0.1", 0))
    host.listen(1)
    port = host.getsockname()[1]
    code = (
        "import socket\nfor addr in [('127.0.0.1', %d), ('1.1.1.1', 53), ('8.8.8.8', 443)]:\n"
        "    try:\n        s = socket.create_connection(addr, timeout=1); print('CONNECTED', addr)\n"
        "    except OSError as e:\n        print('blocked', e.errno)\n" % port
    )
    r = pool.run(code)
    host.close()
    assert "CONNECTED" not in r.stdout and r.stdout.count("blocked") == 3


def test_host_files_are_invisible_and_the_filesystem_read_only(pool, tmp_path):
    secret = tmp_path / "hidden_tests.jsonl"
    secret.write_text("expected output")
    secret.chmod(0o644)
    code = (
        "import os\nfor p in ['/etc/shadow', '/etc/passwd', %r, '/root', '/work/main/README.md']:\n"
        "    try:\n        open(p).read(); print('READ', p)\n    except OSError as e:\n        print('denied', e.errno)\n"
        "for p in ['/usr/evil', '/evil', '/proc/evil', %r]:\n"
        "    try:\n        open(p, 'w').write('x'); print('WROTE', p)\n    except OSError as e:\n        print('denied', e.errno)\n"
        % (str(secret), str(tmp_path / "written_from_sandbox"))
    )
    r = pool.run(code)
    assert "READ" not in r.stdout and "WROTE" not in r.stdout and r.stdout.count("denied") == 9, r.stdout
    assert not (tmp_path / "written_from_sandbox").exists()


def test_private_tmp_is_wiped_between_runs(pool):
    for _ in range(len(pool.uids) + 1):  # reach every worker
        assert pool.run("open('/tmp/left', 'w').write('x'); open('here', 'w').write('y')").ok
    r = pool.run("import os; print(sorted(os.listdir('/tmp')), sorted(os.listdir('.')))")
    assert r.stdout == "[] []\n"


def test_killing_the_parent_or_everything_hurts_only_the_run(pool):
    for code in ("import os\nos.kill(os.getppid(), 9)\nprint('still here')",
                 "import os\nos.kill(-1, 9)\nprint('survived')",
                 "import os, signal\nos.kill(1, signal.SIGKILL)\nos.kill(1, signal.SIGSTOP)\nprint('ok')"):
        r = pool.run(code)
        # the worker is PID 1 of the run's namespace: the kernel drops these signals, so it lives on
        assert "lost" not in r.reason and r.returncode in (0, 1), r
    assert pool.run("print('worker fine')").stdout == "worker fine\n"


def test_setsid_double_fork_does_not_outlive_the_run(pool):
    # the grandchild proves it is running (a byte through a pipe the parent waits on) before the
    # parent exits, so the check below cannot pass because the escape never started
    code = (
        "import os, time\nr, w = os.pipe()\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        os.write(w, b'g')\n        time.sleep(0.6); print('ESCAPED', flush=True)\n"
        "        open('/tmp/escaped', 'w').write('x')\n        time.sleep(30)\n    os._exit(0)\n"
        "assert os.read(r, 1) == b'g'\nprint('grandchild running, parent done')\n"
    )
    assert pool.run(code).stdout == "grandchild running, parent done\n"
    # a grandchild still alive would be a process in the worker's namespace: every worker shows
    # only itself (pid 1) and the run that looks, with an empty /tmp
    for _ in range(len(pool.uids) + 1):
        r = pool.run("import os; print(os.listdir('/tmp'), len([p for p in os.listdir('/proc') if p.isdigit()]))")
        assert r.stdout.startswith("[] 2"), r.stdout


def test_rlimits_cannot_be_raised(pool):
    code = (
        "import resource\nfor name in ['RLIMIT_AS', 'RLIMIT_NPROC', 'RLIMIT_CPU', 'RLIMIT_FSIZE', 'RLIMIT_NOFILE']:\n"
        "    r = getattr(resource, name)\n    soft, hard = resource.getrlimit(r)\n"
        "    try:\n        resource.setrlimit(r, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)); print('RAISED', name)\n"
        "    except (ValueError, OSError):\n        print('kept', name, hard != resource.RLIM_INFINITY)\n"
    )
    r = pool.run(code)
    assert "RAISED" not in r.stdout and r.stdout.count("kept") == 5 and "False" not in r.stdout


def test_seccomp_blocks_namespaces_and_ptrace(pool):
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.unshare(0x10000000), ctypes.get_errno())\n"  # CLONE_NEWUSER
        "print(libc.ptrace(0, 0, 0, 0), ctypes.get_errno())\n"
    )
    r = pool.run(code)
    assert r.stdout.split() == ["-1", "1", "-1", "1"]  # EPERM both


def test_test_process_is_unaffected_and_runs_are_parallel(pool):
    limits = {r: resource.getrlimit(r) for r in (resource.RLIMIT_AS, resource.RLIMIT_NPROC, resource.RLIMIT_NOFILE)}
    threads = threading.active_count()
    results = pool.map([Job("import time; time.sleep(0.5); print(1)")] * 4)
    assert all(r.ok for r in results)
    assert {r: resource.getrlimit(r) for r in limits} == limits
    assert threading.active_count() == threads


def test_runs_overlap_in_time(pool):
    # the mechanism, not a wall time: each run prints the system-wide monotonic clock when it
    # starts and ends (1 s apart); with two workers, two runs' intervals overlap
    code = "import time\na = time.monotonic(); time.sleep(1.0); print(a, time.monotonic())"
    spans = sorted(tuple(map(float, r.stdout.split())) for r in pool.map([Job(code)] * 4))
    assert len(spans) == 4 and all(b - a >= 1.0 for a, b in spans)
    assert any(spans[i + 1][0] < spans[i][1] for i in range(3)), spans  # some run started before another ended


def test_workers_are_recycled():
    with SandboxPool(SandboxConfig(workers=1, recycle_every=3)) as p:
        for _ in range(7):
            assert p.run("print(1)").ok
        # replaced after runs 3 and 6 (the worker thread recycles after handing back a result,
        # so the 7th run is what guarantees the second replacement has happened)
        assert len(set(p._workers[0].pids)) == 3


def test_best_effort_is_explicit(monkeypatch):
    from rollwise.filter.sandbox import isolation
    from rollwise.filter.sandbox import pool as pool_mod

    weaker = isolation.Isolation(root=True, python=detect().python, python_note="", bwrap=None,
                                 bwrap_note="not installed (apt-get install -y bubblewrap)", seccomp=True, seccomp_note="")
    monkeypatch.setattr(pool_mod, "detect", lambda *a: weaker)
    with pytest.raises(SandboxUnavailable, match="sandbox.isolation=best_effort"):
        SandboxPool(SandboxConfig(workers=1))
    assert issubclass(SandboxUnavailable, ConfigError)
    with SandboxPool(SandboxConfig(workers=1, isolation="best_effort")) as p:  # rlimits, uid, seccomp; no namespaces
        r = p.run("import os; print(os.getuid() != 0)")
        assert r.stdout == "True\n"
        assert p.run("while True: pass", timeout_s=0.3).timed_out


def test_run_python_entry_point_never_raises_for_what_the_code_did():
    from rollwise.filter.sandbox import ExecResult, Sandbox, run_python

    assert run_python("print(6 * 7)").stdout == "42\n"  # no sandbox given: a one-off pool for this call
    with Sandbox(SandboxConfig(workers=1)) as sb:
        r = run_python("import sys\nprint(sys.stdin.read().upper(), end='')", stdin="abc", timeout_s=2, memory_mb=128,
                       sandbox=sb)
        assert isinstance(r, ExecResult) and r.stdout == "ABC" and r.ok
        for code in ("raise SystemExit('bye')", "import os; os._exit(7)", "import os, signal; os.kill(os.getpid(), 9)",
                     "x = [0] * (10**10)"):
            r = run_python(code, timeout_s=2, memory_mb=128, sandbox=sb)
            assert not r.ok and isinstance(r.returncode, int)
        assert run_python("import os; os.kill(os.getpid(), 9)", sandbox=sb).reason == "killed by SIGKILL"
        assert run_python("print(input())", stdin="a\udcffb", sandbox=sb).stdout == "a?b\n"  # unencodable, no crash
        assert run_python("print('\\udcff')", sandbox=sb).stdout == "\\udcff\n"  # printed escaped
        r = run_python("print('\udcff')", sandbox=sb)  # a lone surrogate in the source itself: fails, cleanly
        assert r.returncode == 1 and "lost" not in r.reason
        assert sb.started
    assert not sb.started  # closed with the context


def test_a_sandbox_handle_starts_nothing_until_used():
    from rollwise.filter.sandbox import Sandbox

    sb = Sandbox(SandboxConfig(workers=1))
    assert not sb.started
    sb.close()  # closing an unstarted handle is fine
    assert sb.pool.run("print(1)").stdout == "1\n" and sb.started
    sb.close()
    sb.close()  # and idempotent
    assert not sb.started
