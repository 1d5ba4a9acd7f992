"""``bounded``: a call that fails the test instead of hanging it (tests of timeouts whose regression
would otherwise hang the suite)."""

import threading


def bounded(fn, *args, limit: float = 90.0):
    """``fn(*args)`` on a thread; a call still running after ``limit`` seconds fails the test (never hangs it).
    What it raised is re-raised in the test's thread."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn(*args)
        except BaseException as err:  # noqa: BLE001 — handed to the test
            out["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), f"{getattr(fn, '__name__', fn)} still running after {limit:g} s: it was not stopped"
    if "error" in out:
        raise out["error"]
    return out["value"]
