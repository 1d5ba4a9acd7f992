"""The loop's contracts and the bugs issue 10 found in it, each with a test that failed before.

- the LR schedule advances once per training step, whatever ``optim.num_iterations``;
- skipping zero-advantage rows changes no parameter, and really skips them;
- trainer and behaviour log-probs are computed on one distribution under top-k/top-p;
- shaping terms (DAPO's overlong penalty) never change which rollouts are correct;
- ``Trainer.fit`` stops on steps, generated tokens or minutes; strategies keep the Generator contract;
- the CLI turns only ConfigError into a one-line error: a bug keeps its traceback.
"""

import copy
from dataclasses import replace

import pytest
import torch
from typer.testing import CliRunner

from rollwise.generate import STRATEGIES, Generator
from rollwise.optim.batch import build_batch
from rollwise.optim.objective import ObjectiveConfig, assign_advantages
from rollwise.optim.update import UpdateSpec, policy_update, rows_with_signal
from rollwise.train.build import lr_lambda
from rollwise.train.config import load_run_config
from rollwise.train.loop import Trainer
from rollwise.train.state import RunLimits
from rollwise.types import Prompt, Rollout, RolloutGroup

FAST = [
    "task.max_digits=2", "task.eval_size=8", "rollout.prompts_per_step=4", "rollout.num_generations=4",
    "rollout.max_new_tokens=24", "train.eval_samples=0", "optim.micro_batch_size=8", "model.threads=1",
    "train.eval_every=0", "train.checkpoint_every=0",
]


def trainer_for(tmp_path, *extra) -> Trainer:
    t = Trainer(load_run_config(None, [f"output_dir={tmp_path}", *FAST, *extra]))
    t.prepare()
    return t


def test_lr_schedule_steps_once_per_training_step(tmp_path):
    # before: scheduler.step() ran inside the iteration loop, so with num_iterations=2 the cosine
    # schedule reached its floor at half the run
    with trainer_for(tmp_path, "train.steps=6", "optim.schedule=cosine", "optim.num_iterations=2",
                     "optim.lr=1e-3", "sft.steps=0") as t:
        t.fit()
        lrs = [m["lr"] for m in _metrics(t) if "lr" in m]
        factor = lr_lambda(t.cfg)
        assert lrs == pytest.approx([1e-3 * factor(s) for s in range(6)])
        assert lrs[3] > 1e-3 * t.cfg.optim.min_lr_ratio * 1.5  # half way, still well above the floor
        assert t.scheduler.last_epoch == 6


def _metrics(t):
    from rollwise.train.metrics import read_metrics

    return read_metrics(t.run_dir)


def _rollout(prompt_ids, completion, reward, finish="stop"):
    n = len(completion)
    return Rollout(prompt_id="p", prompt_ids=prompt_ids, completion_ids=completion, behavior_logprobs=[-1.0] * n,
                   versions=[0] * n, finish_reason=finish, reward=reward, score=reward)


def _groups(tok):
    """Four groups of the tiny model's tokens: two carry signal, two are flat (all 1, all 0)."""
    ids = list(range(4, 30))
    make = [[1.0, 0.0, 1.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    groups = []
    for gi, rewards in enumerate(make):
        rollouts = [_rollout(ids[gi : gi + 3], ids[gi + j : gi + j + 4 + j], r) for j, r in enumerate(rewards)]
        groups.append(RolloutGroup(Prompt(f"p{gi}", "x"), rollouts))
    return groups


@pytest.mark.parametrize("method", ["grpo", "dapo", "cispo", "gspo", "sapo"])
@pytest.mark.parametrize("iterations", [1, 2])
def test_skipping_zero_advantage_rows_changes_nothing(tiny, method, iterations):
    model, tok = tiny
    objective = ObjectiveConfig(method=method)
    groups = _groups(tok)
    assign_advantages(groups, objective)
    batch = build_batch(groups, tok.pad_token_id)
    assert rows_with_signal(batch).tolist() == [True] * 3 + [False] * 6 + [True] * 3
    results = {}
    for skip in (False, True):
        m = copy.deepcopy(model)
        forwards = []
        m.register_forward_hook(lambda mod, args, kwargs, out: forwards.append(kwargs["input_ids"].shape[0]),
                                with_kwargs=True)
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)
        spec = UpdateSpec(objective, passes=iterations, micro_batch_size=4, max_grad_norm=1e9, max_len=24,
                          skip_zero_advantage=skip)
        metrics = policy_update(m, opt, copy.deepcopy(batch), spec)
        results[skip] = (m, metrics, sum(forwards))
    (full, m_full, n_full), (skipped, m_skip, n_skip) = results[False], results[True]
    passes = iterations + (iterations > 1)  # old log-probs, then each iteration
    assert n_full == 12 * passes and n_skip == 6 * passes  # rows actually run through the model
    assert m_skip["update/skipped_rows"] == pytest.approx(0.5) and m_full["update/skipped_rows"] == 0
    assert m_skip["loss"] == pytest.approx(m_full["loss"], abs=1e-6)
    assert m_skip["grad_norm"] == pytest.approx(m_full["grad_norm"], rel=1e-4) and m_full["grad_norm"] > 0
    # the last iteration's gradients are equal, up to float rounding (rows summed in another order)
    # (GSPO's tiny clip zeroes every gradient on the second pass: the two must agree on that too)
    scale = max(float(p.grad.abs().max()) for p in full.parameters())
    assert scale > 0 or (method, iterations) == ("gspo", 2)
    for (name, a), b in zip(full.named_parameters(), skipped.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-3, atol=1e-4 * scale), name


def test_a_batch_without_signal_still_steps_the_optimizer(tiny):
    """All rows skipped: AdamW still takes its zero-gradient step (momentum moves), as without skipping."""
    model, tok = tiny
    objective = ObjectiveConfig()
    groups = _groups(tok)
    assign_advantages(groups, objective)
    batch = build_batch(groups, tok.pad_token_id)
    flat = batch.select(torch.tensor([3, 4, 5, 6, 7, 8]))  # the two flat groups only
    after = {}
    for skip in (False, True):
        m = copy.deepcopy(model)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        spec = UpdateSpec(objective, micro_batch_size=12, max_len=24, skip_zero_advantage=skip)
        policy_update(m, opt, copy.deepcopy(batch), spec)  # builds momentum
        before = [p.detach().clone() for p in m.parameters()]
        policy_update(m, opt, copy.deepcopy(flat), replace(spec, micro_batch_size=4))
        after[skip] = m
        assert any(not torch.equal(a, b) for a, b in zip(before, m.parameters()))  # momentum moved them
    for a, b in zip(after[False].parameters(), after[True].parameters()):
        assert torch.allclose(a, b, atol=1e-6)


@pytest.fixture(scope="module")
def sft30(tmp_path_factory):
    """The tiny model after 30 SFT steps on FAST's task (its saved directory), one for the three cases below."""
    out = tmp_path_factory.mktemp("sft30")
    with trainer_for(out, "name=sft30", "sft.steps=30", "train.steps=0"):
        pass
    return out / "sft30" / "init_model"


@pytest.mark.parametrize("extra", [["rollout.top_k=5"], ["rollout.top_p=0.7"], ["rollout.top_k=8", "rollout.top_p=0.9"]])
def test_trainer_logprobs_use_the_sampling_distribution(tmp_path, sft30, extra):
    # before: the trainer's log-probs ignored top_k/top_p, so on-policy logprob_gap measured the
    # filter (about 0.3 nats per token here) and tis_mis masked sequences for it
    with trainer_for(tmp_path, f"model.path={sft30}", "rollout.temperature=1.3", "optim.skip_zero_advantage=false",
                     *extra) as t:
        m = t.step()
        assert m["logprob_gap/behavior_vs_policy"] < 1e-4, m["logprob_gap/behavior_vs_policy"]
        assert m.get("tis/masked_sequences", 0.0) == 0.0


def test_overlong_shaping_does_not_change_what_is_correct():
    """Under dapo a correct long answer is penalised in ``reward`` but stays correct."""
    from rollwise.filter.overlong import add_overlong_penalty

    # max_len 20, cache 4: length 18 → −0.5, length 20 → −1
    long_right = _rollout([1], [5] * 18, 1.0)
    full_right = _rollout([1], [5] * 20, 1.0, "length")
    short_wrong = _rollout([1], [5] * 3, 0.0)
    group = RolloutGroup(Prompt("p", "x"), [long_right, full_right, short_wrong])
    add_overlong_penalty([group], max_len=20, cache=4)
    assert [r.reward for r in group.rollouts] == [0.5, 0.0, 0.0]
    assert [r.correct for r in group.rollouts] == [True, True, False]  # before: 0.5 and 0.0 counted as wrong
    assert group.pass_rate == pytest.approx(2 / 3)
    # DRPO judges by the verdict: both correct ones get positive advantages despite the penalty
    assign_advantages([group], ObjectiveConfig(method="drpo"))
    assert long_right.advantage[0] > 0 and full_right.advantage[0] > 0 > short_wrong.advantage[0]


def test_fit_stops_at_each_limit(tmp_path):
    with trainer_for(tmp_path, "name=steps", "train.steps=3", "sft.steps=0") as t:
        summary = t.fit()
        assert (t.stopped_by, summary["steps"]) == ("steps=3", 3)
    with trainer_for(tmp_path, "name=tokens", "train.steps=100", "sft.steps=0") as t:
        summary = t.fit(RunLimits(generated_tokens=1))  # the first step samples more than one token
        assert (t.stopped_by, summary["steps"]) == ("max_generated_tokens=1", 1)
        assert summary["generated_tokens"] > 1
    with trainer_for(tmp_path, "name=minutes", "train.steps=100", "sft.steps=0") as t:
        summary = t.fit(RunLimits(minutes=1e-9))
        assert summary["steps"] == 1 and t.stopped_by.startswith("max_minutes")
        assert summary["final_accuracy"] is not None  # the last step is evaluated


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_every_strategy_keeps_the_generator_contract(tmp_path, strategy):
    with trainer_for(tmp_path, f"rollout.strategy={strategy}", "sft.steps=0") as t:
        assert isinstance(t.generator, Generator)
        groups, metrics = t.generator.generate(t.engine, t.select_prompts(), [4] * 4, seed=0)
        assert groups and all(isinstance(g, RolloutGroup) for g in groups) and isinstance(metrics, dict)
        state = t.generator.state_dict()
        assert isinstance(state, dict)
        t.generator.load_state_dict(state)


def test_cli_keeps_the_traceback_of_a_bug(tmp_path, monkeypatch):
    from rollwise.cli import app

    runner = CliRunner()
    bad = runner.invoke(app, ["train", "--set", "optim.lrr=1"])
    assert bad.exit_code == 2 and "did you mean 'optim.lr'" in bad.output  # a user's mistake: one line

    def broken(*a, **k):
        raise ValueError("internal bug")

    monkeypatch.setattr("rollwise.train.run.run_training", broken)
    result = runner.invoke(app, ["train", "--set", f"output_dir={tmp_path}"])
    assert result.exit_code == 1 and isinstance(result.exception, ValueError)  # before: exit 2, "error: internal bug"
    assert "error:" not in result.output
