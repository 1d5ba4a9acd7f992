"""A two-process test harness: trusted tests in one process, the candidate's code in another.

Why: a program that runs its tests in its own process can fake a pass. Tried on the real
HumanEval file: ``import sys; sys.exit(0)`` at the end of a completion exits 0 before the
tests run (it passed every problem tried), and a function returning an object whose ``__eq__``
always answers True passed 157 of 164 problems; MBPP asserts with a non-literal expected value
(``assert f(2) == sorted([4])[0]``) fall to the same object. RL finds such exploits quickly.

How (inside one sandbox run, ``rollwise.filter.sandbox``):

- the **parent** process runs only trusted text: the dataset's prompt/setup and test code
  (HumanEval's ``check``, MBPP's asserts). It makes itself non-dumpable (``PR_SET_DUMPABLE 0``),
  so a process of the same uid cannot read or write its memory or reach its file descriptors
  through ``/proc``;
- it forks the **child**, which points stdin/stdout/stderr at ``/dev/null``, closes every other
  descriptor but two pipes, and only then executes the candidate's code;
- the candidate's functions reach the tests as **proxies**: each call sends its arguments to the
  child and receives the return value as **plain data** — ``None``, ``bool``, ``int``, ``float``,
  ``complex``, ``str``, ``bytes`` and ``list``/``tuple``/``dict``/``set``/``frozenset`` of them,
  exact types checked by the child's encoder and rebuilt by the parent's decoder from JSON (so
  an object of the candidate's class never reaches a comparison: the parent only ever compares
  values it built itself);
- a pass is **positive evidence**: the parent prints the verdict line only after every test
  returned; an early exit, ``os._exit``, a killed child, a hang (per-call deadline) or a value
  that is not plain data is a failure with a reason. The child cannot write to the parent's
  stdout (its own is ``/dev/null``).

What remains possible: the candidate computes whatever values it likes (it is the function
under test); tests that rely on mutating an argument in place or on object identity across
calls see copies; a candidate that breaks the sandbox itself is out of scope here (see
``docs/sandbox.md``).
"""

from __future__ import annotations

import json
import secrets

VERDICT = "\x00rollwise-harness"

# The program the sandbox runs; it holds no data. Its stdin carries two JSON parts: the head
# (candidate source, names to proxy — empty = every callable it defines —, call_timeout), read
# before the fork with exact-length reads so nothing else is buffered, and the rest (trusted
# source run in the parent before the tests, the tests, the job's random tag), read by the
# parent after the fork: the tests and the tag never exist in the candidate's memory.
_PROGRAM = r'''
import ctypes, json, os, select, sys

def _read_exact(n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(0, n - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf

_P = json.loads(_read_exact(int(_read_exact(10))))
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0: no /proc/<pid>/mem, fd or environ for others

def _enc(v, depth=0):
    if depth > 50:
        raise TypeError("nested too deeply")
    t = type(v)
    if v is None or t is bool or t is str:
        return v
    if t is int:
        return {"i": str(v)}
    if t is float:
        return {"f": v.hex()}
    if t is complex:
        return {"c": [v.real.hex(), v.imag.hex()]}
    if t is bytes:
        return {"b": v.hex()}
    if t in (list, tuple, set, frozenset):
        return {{list: "l", tuple: "t", set: "s", frozenset: "z"}[t]: [_enc(x, depth + 1) for x in v]}
    if t is dict:
        return {"d": [[_enc(k, depth + 1), _enc(x, depth + 1)] for k, x in v.items()]}
    raise TypeError("not plain data: " + t.__name__)

def _dec(v):
    if v is None or type(v) in (bool, str):
        return v
    (k, x), = v.items()
    if k == "i":
        return int(x)
    if k == "f":
        return float.fromhex(x)
    if k == "c":
        return complex(float.fromhex(x[0]), float.fromhex(x[1]))
    if k == "b":
        return bytes.fromhex(x)
    if k == "d":
        return {_dec(a): _dec(b) for a, b in x}
    items = [_dec(e) for e in x]
    return {"l": list, "t": tuple, "s": set, "z": frozenset}[k](items)

_to_child_r, _to_child_w = os.pipe()
_to_parent_r, _to_parent_w = os.pipe()
_pid = os.fork()
if _pid == 0:  # the candidate's process
    _null = os.open("/dev/null", os.O_RDWR)
    for _fd in (0, 1, 2):
        os.dup2(_null, _fd)
    _keep = {_to_child_r, _to_parent_w}
    for _fd in range(3, 1024):
        if _fd not in _keep:
            try:
                os.close(_fd)
            except OSError:
                pass
    _in, _out = os.fdopen(_to_child_r, "r"), os.fdopen(_to_parent_w, "w")
    _ns = {"__name__": "__candidate__"}
    try:
        exec(compile(_P["candidate"], "<candidate>", "exec"), _ns)
        _names = _P["names"] or [k for k, v in _ns.items() if callable(v) and not k.startswith("__")]
        _out.write(json.dumps({"ready": [n for n in _names if callable(_ns.get(n))]}) + "\n")
    except BaseException as e:
        _out.write(json.dumps({"error": "the program failed to load: " + type(e).__name__}) + "\n")
    _out.flush()
    for _line in _in:
        _req = json.loads(_line)
        try:
            _r = _ns[_req["name"]](*_dec(_req["args"]), **{k: _dec(v) for k, v in _req["kwargs"]})
            _reply = {"ok": _enc(_r)}
        except BaseException as e:
            _reply = {"raised": type(e).__name__ + (": " + str(e)[:80] if isinstance(e, TypeError) else "")}
        _out.write(json.dumps(_reply) + "\n")
        _out.flush()
    os._exit(0)

os.close(_to_child_r)
os.close(_to_parent_w)
_P.update(json.loads(_read_exact(int(_read_exact(10)))))
_TAG = _P["tag"]
_send, _recv = os.fdopen(_to_child_w, "w"), os.fdopen(_to_parent_r, "r")

class CandidateFailed(Exception):
    pass

def _answer(timeout):
    if not select.select([_recv], [], [], timeout)[0]:
        raise CandidateFailed("timed out after %gs" % timeout)
    line = _recv.readline()
    if not line:
        raise CandidateFailed("the candidate's process ended before the tests did")
    return json.loads(line)

def _proxy(name):
    def call(*args, **kwargs):
        try:
            _send.write(json.dumps({"name": name, "args": _enc(list(args)),
                                     "kwargs": [[k, _enc(v)] for k, v in kwargs.items()]}) + "\n")
            _send.flush()
        except (BrokenPipeError, OSError):
            raise CandidateFailed("the candidate's process ended before the tests did") from None
        reply = _answer(_P["call_timeout"])
        if "raised" in reply:
            raise CandidateFailed(name + " raised " + reply["raised"])
        try:
            return _dec(reply["ok"])
        except Exception:
            raise CandidateFailed(name + " returned something that is not plain data") from None
    call.__name__ = name
    return call

def _fail(why):
    print(_TAG, "FAIL", why.replace("\n", " ")[:200], flush=True)
    os._exit(0)

try:
    _hello = _answer(_P["call_timeout"] + 2.0)
except CandidateFailed as e:
    _fail(str(e))
if "error" in _hello:
    _fail(_hello["error"])
_g = {"__name__": "__main__", "CandidateFailed": CandidateFailed}
try:
    exec(compile(_P["trusted"], "<trusted>", "exec"), _g)
except BaseException as e:
    _fail("the trusted setup failed: " + type(e).__name__)
for _n in _hello["ready"]:
    if _P["names"] or _n not in _g:  # trusted helpers keep their own definitions
        _g[_n] = _proxy(_n)
for _n in _P["names"]:
    if _n not in _hello["ready"]:
        _fail("the program defines no function " + _n)
_results = []
for _i, _test in enumerate(_P["tests"]):
    try:
        exec(compile(_test, "<test %d>" % _i, "exec"), _g)
        _results.append("")
    except CandidateFailed as e:
        _results.append(str(e))
    except AssertionError:
        _results.append("assertion failed")
    except BaseException as e:
        _results.append("test raised " + type(e).__name__)
print(_TAG, "DONE", json.dumps(_results), flush=True)
'''


def harness_job(candidate: str, tests: list[str], trusted: str = "", names: list[str] | None = None,
                call_timeout: float = 2.0) -> tuple[str, str, str]:
    """(program, stdin, tag) of one sandbox run: ``tests`` run in the trusted process against
    proxies of the candidate's functions (``names``, or every function it defines)."""
    tag = VERDICT + secrets.token_hex(8)
    head = json.dumps({"candidate": candidate, "names": list(names or []), "call_timeout": float(call_timeout)})
    rest = json.dumps({"trusted": trusted, "tests": list(tests), "tag": tag})
    stdin = "".join(f"{len(part.encode()):010d}{part}" for part in (head, rest))
    return _PROGRAM, stdin, tag


def read_verdict(stdout: str, tag: str, n_tests: int) -> list[str] | str:
    """Per-test failure reasons ('' = passed) from the parent's verdict line, or one reason for all.

    Only the parent, after running every test, prints the ``DONE`` line; the tag is random per
    job (the candidate never sees it: its stdout is /dev/null and the tag reaches only the parent).
    """
    for line in reversed(stdout.splitlines()):
        if line.startswith(tag + " DONE "):
            results = json.loads(line[len(tag) + 6 :])
            if isinstance(results, list) and len(results) == n_tests and all(isinstance(r, str) for r in results):
                return results
            return "malformed verdict"
        if line.startswith(tag + " FAIL "):
            return line[len(tag) + 6 :]
    return "no verdict: the test harness did not finish"
