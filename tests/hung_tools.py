"""An environment whose tools hold the GIL and never return (tests/test_tool_safety.py), importable
without torch so a fresh interpreter can load it in a few seconds."""

from __future__ import annotations

from rollwise.tasks.environment import episode_envs
from rollwise.tasks.tool_calls import ToolCall


class Stubborn:
    """Tools that hold the GIL and never return, beside a stateful one."""

    def reset(self, **row):
        self.total = 0

    def add(self, k: int) -> int:
        """Add to the running total.

        Args:
            k: how much
        """
        self.total += k
        return self.total

    def power(self, exponent: int) -> str:
        """A big-int power (one bytecode: a thread timeout cannot interrupt it).

        Args:
            exponent: the exponent
        """
        return str(len(str(7 ** exponent)))

    def spin(self) -> str:
        """A pure-Python loop that never ends."""
        while True:
            pass

    def die(self) -> str:
        """Kill the process holding the environment."""
        import os

        os._exit(3)


def stubborn_envs(timeout: float = 1.0):
    return episode_envs("hung_tools:Stubborn", timeout, 200)


def call_that_holds_the_gil(call: ToolCall) -> tuple:
    """(a call before, the call's error kind and message, the worker's restarts, a call after)."""
    envs = stubborn_envs()
    env = envs()
    env.reset({})
    first = env.call(ToolCall("add", {"k": 2})).text
    result = env.call(call)
    after = env.call(ToolCall("add", {"k": 3})).text
    env.close()
    return first, result.error, result.text, envs.worker.restarts, after
