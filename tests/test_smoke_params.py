"""Smoke runs that can fail: one training step of every objective preset and every rollout
strategy must change the policy's parameters (TRL's "every trainable parameter changed" check).

A smoke test that only checks for no crash passes with a zeroed loss; this one does not
(``test_a_zeroed_loss_fails_the_check``). All cases start from the suite's shared warm start on
1-digit arith (conftest.py) whose sampled rewards are mixed, so groups carry a signal (asserted too).

Every trainable tensor is checked (38 in the tiny preset: the tied embedding, each block's
projections and norms, the final norm), nothing excluded: one Adam step moves every element
whose gradient is non-zero, and a tensor counts as changed when any element moved (rows of
the tied embedding for tokens no rollout used may stay put; the tensor still changes).
``optim.weight_decay=0`` is set here: AdamW's decay moves every parameter even with a zero
gradient, so with it an untrained parameter would pass as changed.
"""

import math

import pytest
import torch

from rollwise.generate import STRATEGIES
from rollwise.optim.objective import PRESETS
from rollwise.train.config import load_run_config
from rollwise.train.loop import Trainer

SMOKE = ["task.max_digits=1", "task.eval_size=20", "rollout.prompts_per_step=8", "rollout.num_generations=4",
         "rollout.max_new_tokens=24", "train.eval_samples=0", "train.eval_size=4", "optim.micro_batch_size=64",
         "model.threads=1", "optim.lr=1e-3", "optim.weight_decay=0"]


def one_step(tmp_path, warm, *extra) -> tuple[dict, list[str], int]:
    """Train one step from the warm start: (metrics, names of unchanged parameters, parameter count)."""
    cfg = load_run_config(None, [f"output_dir={tmp_path}", *SMOKE, f"model.path={warm}", "sft.steps=0", *extra])
    with Trainer(cfg) as t:
        t.prepare()
        before = {n: p.detach().clone() for n, p in t.model.named_parameters() if p.requires_grad}
        m = t.step()
        unchanged = [n for n, p in t.model.named_parameters() if p.requires_grad and torch.equal(before[n], p)]
    return m, unchanged, len(before)


@pytest.mark.parametrize("method", list(PRESETS))
def test_every_objective_changes_every_parameter(tmp_path, warm, method):
    extra = ["rollout.num_generations=5"] if method == "mc_grpo" else []  # G + 1, G even
    m, unchanged, _ = one_step(tmp_path, warm, f"objective.method={method}", *extra)
    assert m["groups/zero_signal"] < 1, m  # the precondition: some group carries a signal
    assert [k for k, v in m.items() if not math.isfinite(v)] == [], m
    assert unchanged == [], (method, unchanged)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_every_strategy_changes_every_parameter(tmp_path, warm, strategy):
    m, unchanged, _ = one_step(tmp_path, warm, f"rollout.strategy={strategy}")
    assert m["groups/zero_signal"] < 1, m
    assert unchanged == [], (strategy, unchanged)


def test_a_zeroed_loss_fails_the_check(tmp_path, warm, monkeypatch):
    """The check has teeth: with the loss multiplied by 0 every parameter stays where it was."""
    import rollwise.optim.update as update

    real, calls = update.policy_loss, []

    def zeroed(*args, **kwargs):
        calls.append(1)
        loss, metrics = real(*args, **kwargs)
        return loss * 0, metrics

    monkeypatch.setattr(update, "policy_loss", zeroed)
    m, unchanged, total = one_step(tmp_path, warm)
    assert m["groups/zero_signal"] < 1 and m["update/trained_tokens"] > 0 and calls  # the loss was computed
    assert len(unchanged) == total == 38
