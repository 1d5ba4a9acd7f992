"""tests/once.py: two processes asking for one shared fixture at once get one build, made by one of them."""

import subprocess
import sys
from pathlib import Path

import pytest
from once import once

ASK = """
import sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from once import once

root, me, other = Path(sys.argv[1]), sys.argv[2], sys.argv[3]

def build(out):
    with open(root / "builds", "a") as f:
        f.write(me + "\\n")
    # stay in the build until the other process asks too (at most a minute), then a moment longer: without
    # the lock it would find no finished build and start its own
    deadline = time.monotonic() + 60
    while not (root / f"{{other}}-asks").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)
    out.mkdir()
    (out / "by").write_text(me)

(root / f"{{me}}-asks").touch()
print(once(root, "thing", build).joinpath("by").read_text())
"""


def test_two_processes_asking_at_once_share_one_build(tmp_path):
    script = ASK.format(tests=str(Path(__file__).parent))
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path), me, other], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for me, other in (("a", "b"), ("b", "a"))]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    builders = (tmp_path / "builds").read_text().split()
    assert len(builders) == 1, builders  # one build ...
    assert [out.strip() for out, _ in outs] == builders * 2  # ... and both read it


def test_a_build_that_raised_is_built_again(tmp_path):
    def broken(out):
        out.mkdir()
        (out / "half").write_text("")
        raise RuntimeError("killed mid-build")

    with pytest.raises(RuntimeError):
        once(tmp_path, "thing", broken)
    out = once(tmp_path, "thing", lambda out: out.mkdir())
    assert out.is_dir() and not (out / "half").exists()
