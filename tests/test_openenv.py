"""OpenEnv environments as episodes (issue 25, ``tasks/openenv.py``), against a real OpenEnv server.

``ProductEnv`` below is an MCP environment built the way OpenEnv's own are (``MCPEnvironment`` +
``create_app``): a calculator, a per-session counter, and ``submit`` that is rewarded 1 when the
answer is the row's and ends the episode. It is served on 127.0.0.1 by uvicorn in a thread, and by
a separate process (``python tests/test_openenv.py FD``, on a socket it inherits) where a test needs to kill it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

pytest.importorskip("openenv.core.env_server.mcp_environment", reason="the rollwise[openenv] extra")

from fastmcp import FastMCP  # noqa: E402
from openenv.core.env_server.http_server import create_app  # noqa: E402
from openenv.core.env_server.mcp_environment import MCPEnvironment  # noqa: E402
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation  # noqa: E402
from openenv.core.env_server.types import Observation, State  # noqa: E402

from rollwise.config import ConfigError  # noqa: E402
from rollwise.engine.sampling import SamplingParams  # noqa: E402
from rollwise.filter.rewards import score_groups  # noqa: E402
from rollwise.generate.episode import EpisodeSampler  # noqa: E402
from rollwise.model.tiny import char_tokenizer  # noqa: E402
from rollwise.tasks.environment import episode_envs, load_environment  # noqa: E402
from rollwise.tasks.envs import Calculator  # noqa: E402
from rollwise.tasks.tool_calls import FORMATS, ToolCall  # noqa: E402
from rollwise.types import Prompt  # noqa: E402

PLAIN = FORMATS["plain"]
# openenv 0.3.0's MCPEnvironment reads fastmcp's renamed Tool.inputSchema (its code, not ours)
pytestmark = pytest.mark.filterwarnings("ignore:Accessing `Tool.inputSchema` is deprecated:DeprecationWarning")


# -- the environment, as an OpenEnv author writes one -------------------------------------------------
class Task(Observation):
    prompt: str = ""


class ProductEnv(MCPEnvironment):
    """Multiply with a calculator and submit the product: reward 1 for the row's answer, then done."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        mcp = FastMCP("product")
        self.counter, self.answer = 0, None

        @mcp.tool()
        def calculate(expression: str) -> str:
            """Evaluate an arithmetic expression exactly.

            Args:
                expression: numbers with + - * / and parentheses
            """
            return Calculator().calculate(expression)

        @mcp.tool()
        def count() -> int:
            """Add one to this session's counter and return it."""
            self.counter += 1
            return self.counter

        @mcp.tool()
        async def wait(seconds: float) -> str:
            """Wait, then answer.

            Args:
                seconds: how long
            """
            await asyncio.sleep(seconds)
            return "waited"

        @mcp.tool()
        def submit(answer: str) -> str:
            """Submit the final answer.

            Args:
                answer: the product
            """
            return "received"

        super().__init__(mcp)

    def reset(self, seed=None, episode_id=None, **row):
        self.counter, self.answer = 0, row.get("answer")
        return Task(prompt="Multiply with the calculator, then submit.")

    async def step_async(self, action, timeout_s=None, **kwargs):
        # over /ws an MCPEnvironment steps with step_async; the reward rides on the submit's observation
        obs = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        if isinstance(action, CallToolAction) and action.tool_name == "submit":
            obs.reward, obs.done = float(str(action.arguments.get("answer")) == str(self.answer)), True
        return obs

    def _step_impl(self, action, timeout_s=None, **kwargs):
        return Observation()

    @property
    def state(self):
        return State()


app = create_app(ProductEnv, CallToolAction, CallToolObservation, max_concurrent_envs=16)


# -- serving it ------------------------------------------------------------------------------------------
@contextlib.contextmanager
def unanswered_port():
    """A port nothing answers on (a connection is refused) and no other process can take while the block
    runs: it stays bound, never listened on. A port merely found free could be taken meanwhile by another
    test process's server (pytest -n)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def listening_socket() -> socket.socket:
    """A socket listening on a free port of 127.0.0.1, bound here: a server handed it has its port from the
    start, with no moment where another process could take it (a server told a port number binds it late)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def wait_healthy(url: str, proc=None, bound: float = 90.0) -> None:
    """Poll ``/health`` until it answers (at most ``bound`` seconds; a server process that exits fails now)."""
    deadline = time.monotonic() + bound
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server process exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1.0) as r:
                if r.status == 200:
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.fixture(scope="module")
def server():
    """``ProductEnv`` served by uvicorn in a thread of this process, on a free port: its URL."""
    import uvicorn

    sock = listening_socket()
    srv = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    wait_healthy(url)
    yield url
    srv.should_exit = True
    thread.join(10)
    sock.close()


def sampler(tok, url, max_turns=4, max_new_tokens=200):
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, stop_token_ids=(tok.eos_token_id,))
    return EpisodeSampler(params, tok, episode_envs(f"openenv:{url}", 5.0, 2000), PLAIN, max_turns=max_turns)


# -- load: the address and the server are checked once ------------------------------------------------------
@pytest.mark.parametrize("spec", ["openenv:", "openenv:localhost:8000", "openenv:ftp://127.0.0.1:8000",
                                  "openenv:http://127.0.0.1:99999", "openenv:http://127.0.0.1:80?x=1"])
def test_a_malformed_address_is_a_config_error_with_the_fix(spec):
    with pytest.raises(ConfigError, match=r"rollout.environment: .* is not an OpenEnv server address; write "
                                          r"openenv:http://HOST:PORT"):
        load_environment(spec)


def test_an_unreachable_server_is_a_config_error_naming_the_field(tmp_path):
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    with unanswered_port() as port:
        with pytest.raises(ConnectionRefusedError):  # nothing listens there: the check is not vacuous
            socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
        with pytest.raises(ConfigError, match=rf"rollout.environment: no OpenEnv server answers at "
                                              rf"http://127.0.0.1:{port} \(URLError.*\); start it"):
            episode_envs(f"openenv:http://127.0.0.1:{port}", 5.0, 2000)
        # and from a run's config, before any step
        cfg = load_run_config(None, [f"output_dir={tmp_path}", f"rollout.environment=openenv:http://127.0.0.1:{port}",
                                     "model.threads=1"])
        with pytest.raises(ConfigError, match="rollout.environment: no OpenEnv server answers"):
            Trainer(cfg).prepare()


def test_the_servers_tools_come_in_get_json_schemas_shape(server):
    from transformers.utils import get_json_schema

    def calculate(expression: str) -> str:
        """Evaluate an arithmetic expression exactly.

        Args:
            expression: numbers with + - * / and parentheses
        """

    expected = get_json_schema(calculate)
    expected["function"].pop("return")  # MCP has no return schema in the listing
    tools = load_environment(f"openenv:{server}").tools
    assert list(tools) == ["calculate", "count", "wait", "submit"]
    assert tools["calculate"] == expected
    assert tools["count"]["function"]["parameters"] == {"type": "object", "properties": {}}


# -- episodes ---------------------------------------------------------------------------------------------
def test_an_episode_calls_the_servers_tool_token_faithfully_and_is_rewarded(server):
    from test_episodes import ScriptedEngine

    tok = char_tokenizer()

    def script(text):  # calculate, then submit what the calculator said
        return '<call>submit("408")</call>' if "<result>408</result>" in text else '<call>calculate("12*34")</call>'

    engine = ScriptedEngine(tok, script)
    groups, metrics = sampler(tok, server).generate(
        engine, [Prompt("right", "What is 12*34? ", answer="408"), Prompt("wrong", "What is 12*35? ", answer="420")],
        [1, 1], seed=0)
    r = groups[0].rollouts[0]
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    eos = tok.eos_token_id
    # reset's observation text follows the prompt
    assert engine.prompt_ids[0] == tok("What is 12*34? \n\nMultiply with the calculator, then submit.")["input_ids"]
    turn1, inserted, turn2 = ids('<call>calculate("12*34")</call>') + [eos], ids("<result>408</result>"), ids(
        '<call>submit("408")</call>') + [eos]
    # submit's observation said done: the episode ends after that turn, with nothing inserted after it
    assert r.completion_ids == turn1 + inserted + turn2
    assert r.loss_weights == [1] * len(turn1) + [0] * len(inserted) + [1] * len(turn2)
    assert r.behavior_logprobs == [-0.5] * len(turn1) + [0.0] * len(inserted) + [-0.5] * len(turn2)
    assert r.messages[1] == {"role": "tool", "name": "calculate", "content": "408"}
    # the done observation is not shown to the model, so not in the messages: they end with its final turn
    assert r.messages[-1] == {"role": "assistant", "content": '<call>submit("408")</call>'}
    assert len(r.turns) == 2 and metrics["episode/tool_calls"] == 4.0
    # the server's reward is the environment component: the row's answer reached the server's reset
    score_groups(groups, [])
    assert [g.rollouts[0].reward_components for g in groups] == [{"environment": 1.0}, {"environment": 0.0}]


def test_concurrent_episodes_do_not_share_state(server):
    from test_episodes import ScriptedEngine

    tok = char_tokenizer()
    (group,), _ = sampler(tok, server, max_turns=3).generate(
        ScriptedEngine(tok, lambda text: "<call>count()</call>"), [Prompt("p", "count ")], [3], seed=0)
    # the three episodes' turns interleave (one engine run per round); each counts in its own session
    assert [[m["content"] for m in r.messages if m["role"] == "tool"] for r in group.rollouts] == [["1", "2"]] * 3


def test_server_side_tool_errors_are_messages_and_the_session_closes(server):
    env = episode_envs(f"openenv:{server}", 5.0, 2000)()
    assert env.reset({"answer": "1", "not_json": object()}) == "\n\nMultiply with the calculator, then submit."
    raised = env.call(ToolCall("calculate", {"expression": "1/0"}))
    assert raised.error == "raised" and "division by zero" in raised.text
    assert env.call(ToolCall("calculate", {}, ("2+2",))).text == "4"  # positional, as the plain format writes
    assert env.call(ToolCall("calculate", {"expr": "1"})).error == "bad_arguments"
    assert env.call(ToolCall("nope")).error == "unknown_tool"
    assert env.call(ToolCall("x", error="bad json")).error == "parse"
    assert env.reward() == 0.0 and env.client is None  # scored, and its session closed


def test_a_step_that_times_out_ends_the_episode_with_0(server):
    env = episode_envs(f"openenv:{server}", 0.5, 2000)()
    env.reset({})
    assert env.call(ToolCall("wait", {"seconds": 0.0})).text == "waited"
    slow = env.call(ToolCall("wait", {"seconds": 1.5}))  # the server is still waiting: 1.5 s > 0.5 s
    assert slow.error == "timeout" and slow.text == "Error: the environment server failed: wait failed (no answer " \
                                                    "within 0.5 s)"
    assert env.done and env.client is None  # the session is closed: a late answer would be read as the next one
    assert env.call(ToolCall("count")).error == "raised"
    assert env.reward() == 0.0 and env.reward().reason.endswith("wait failed (no answer within 0.5 s)")


def test_a_session_refused_for_capacity_scores_its_episode_0(server):
    envs = episode_envs(f"openenv:{server}", 5.0, 2000)
    opened = []
    for _ in range(17):  # the server admits 16 sessions at once
        opened.append(envs())
        opened[-1].reset({})
        if opened[-1].failure is not None:
            break
    refused = opened[-1]
    assert refused.done and "CAPACITY_REACHED" in refused.failure
    assert refused.reward() == 0.0 and "reset failed" in refused.reward().reason
    assert all(env.reward() == 0.0 for env in opened)  # closes the others


# -- a server that dies mid-step: the episodes score 0 with the reason, and training goes on -------------
class KillsTheServer(type(PLAIN)):
    """Every finished turn calls ``count``; the second time a turn is read, the server process is killed first."""

    def __init__(self, proc):
        self.proc, self.reads = proc, 0

    def parse(self, text):
        self.reads += 1
        if self.reads == 2:
            self.proc.kill()
            self.proc.wait()
        return [ToolCall("count")]


def test_a_server_that_dies_mid_step_scores_its_episodes_0_and_training_goes_on(tmp_path):
    from dataclasses import replace

    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    with listening_socket() as sock:  # the server process gets the socket itself; ours closes once it has it
        port = sock.getsockname()[1]
        proc = subprocess.Popen([sys.executable, __file__, str(sock.fileno())], pass_fds=[sock.fileno()],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        cfg = load_run_config(None, [f"output_dir={tmp_path}", "task.max_digits=2", "task.eval_size=4",
                                     "rollout.prompts_per_step=2", "rollout.num_generations=2",
                                     "rollout.max_new_tokens=60", f"rollout.environment=openenv:{url}",
                                     "rollout.max_turns=3", "rollout.tool_timeout=5", "optim.micro_batch_size=8",
                                     "model.threads=1", "train.eval_samples=0"])
        with Trainer(cfg) as trainer:
            trainer.prepare()  # the server answered the load check
            tok, gen = trainer.tokenizer, trainer.generator
            stops = tuple(tok(c, add_special_tokens=False)["input_ids"][0] for c in "0123456789")
            gen.fmt, gen.params = KillsTheServer(proc), replace(gen.params, stop_token_ids=stops + (tok.eos_token_id,))
            sampled = []
            generate = gen.generate
            gen.generate = lambda *a, **k: sampled.append(generate(*a, **k)) or sampled[-1]
            first = trainer.step()
            # the server is really dead: killed, and nothing answers on its port
            assert proc.returncode == -9
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
            second = trainer.step()  # every reset fails now; the step still scores and trains
        rollouts = [[r for g in groups for r in g.rollouts] for groups, _ in sampled]
        tool = [m["content"] for m in rollouts[0][0].messages if m["role"] == "tool"]
        assert tool[0] == "1"  # the first call went through the live server
        for r in rollouts[0][1:] + rollouts[1]:  # the others met a dead server
            assert r.env_reward == 0.0 and r.env_reward.reason.startswith(f"OpenEnv server {url}: ")
            assert r.reward_components["environment"] == 0.0
            assert r.failure.startswith(("reset failed", "count failed")) and r.reward == 0.0
            assert r.reward_reasons["failure"] == r.failure  # the report shows why
        assert all("reset failed" in r.env_reward.reason for r in rollouts[1])
        # a call that met the dead server ended its episode there (nothing more was shown to the model)
        assert any(r.failure.startswith("count failed") and r.messages[-1]["role"] == "assistant"
                   for r in rollouts[0][1:])
        assert first["episode/raised"] > 0 and first["episode/env_failed"] > 0
        assert second["episode/env_failed"] == len(rollouts[1])  # every reset failed: nothing sampled, all counted
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":  # the killable server: python tests/test_openenv.py FD (a listening socket it inherited)
    import uvicorn

    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[socket.socket(fileno=int(sys.argv[1]))])
