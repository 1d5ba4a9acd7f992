"""support_diag (METHODS.md): pass@k, support shrinkage/expansion against the base model, answer and
token entropy — by hand, and logged by a tiny run's evals."""

import math

import pytest

from rollwise.eval.passk import pass_at_k
from rollwise.eval.support import answer_entropy, support_change, token_entropy, track
from rollwise.types import Prompt, Rollout, RolloutGroup


def test_hand_cases():
    assert round(pass_at_k(4, 2, 2), 4) == 0.8333  # 1 − C(2,2)/C(4,2) = 5/6
    # p = (.5, .25, .25): −(.5 ln .5 + 2 · .25 ln .25) = 1.0397 nats
    assert answer_entropy([3, 3, 5, 7]) == pytest.approx(1.0397, abs=1e-4)
    assert answer_entropy([3, 3, 3]) == 0.0
    assert answer_entropy([None, None, 3, 3]) == pytest.approx(math.log(2))  # "none" is one answer


def test_shrinkage_and_expansion():
    base = {"a": True, "b": True, "c": False, "d": False}
    now = {"a": True, "b": False, "c": False, "d": False}
    assert support_change(base, now) == (0.25, 0.0)  # b lost
    assert support_change(now, base) == (0.0, 0.25)  # reversed: b gained
    first, m0 = track(None, ["a", "b"], [True, False])
    assert first == {"a": True, "b": False} and m0 == {"eval/support_shrinkage": 0.0, "eval/support_expansion": 0.0}
    kept, m1 = track(first, ["a", "b"], [False, True])
    assert kept is first and m1 == {"eval/support_shrinkage": 0.5, "eval/support_expansion": 0.5}


def test_token_entropy_is_mean_negative_logprob():
    p = Prompt(id="p", text="x", token_ids=[1])
    def roll(ids, lps):
        return Rollout(prompt_id="p", prompt_ids=[1], completion_ids=ids, completion_text="", behavior_logprobs=lps,
                       versions=[0] * len(ids), finish_reason="stop")

    rs = [roll([5, 6], [-1.0, -2.0]), roll([7], [-3.0])]
    assert token_entropy([RolloutGroup(p, rs)]) == pytest.approx(2.0)


def test_a_run_logs_support_and_entropy_at_each_eval(tmp_path):
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer
    from rollwise.train.metrics import read_metrics

    sets = [f"output_dir={tmp_path}", "name=sd", "task.max_digits=1", "task.eval_size=6",
            "model.threads=1", "train.eval_samples=4", "train.eval_every=1", "train.steps=2",
            "train.checkpoint_every=0",
            "rollout.prompts_per_step=2", "rollout.num_generations=4", "rollout.max_new_tokens=16", "optim.lr=1e-2"]
    with Trainer(load_run_config(None, sets)) as t:
        t.prepare()
        t.fit()
        run_dir = t.run_dir
        base = dict(t.state.support_base)
    evals = [m for m in read_metrics(run_dir) if "eval/accuracy" in m]
    assert len(evals) >= 3 and len(base) == 6  # steps 0, 1, 2; the base = step 0's solved map
    assert evals[0]["eval/support_shrinkage"] == 0.0 and evals[0]["eval/support_expansion"] == 0.0
    for m in evals:
        assert 0.0 <= m["eval/answer_entropy"] <= math.log(4) + 1e-9  # 4 samples at most 4 answers
        assert m["eval/token_entropy"] > 0.0 and 0.0 <= m["eval/support_shrinkage"] <= 1.0


def test_the_report_shows_them_in_their_own_section():
    from rollwise.report.curves import group_metrics

    groups = group_metrics(["eval/accuracy", "eval/pass@4", "eval/support_shrinkage", "eval/support_expansion",
                            "eval/answer_entropy", "eval/token_entropy", "entropy"])
    assert groups["support"] == ["eval/answer_entropy", "eval/support_expansion", "eval/support_shrinkage",
                                 "eval/token_entropy"]
    assert groups["eval"] == ["eval/accuracy", "eval/pass@4"] and groups["entropy"] == ["entropy"]


def test_rollwise_list_names_it():
    from typer.testing import CliRunner

    from rollwise.cli import app

    result = CliRunner().invoke(app, ["list", "diagnostics"])
    assert result.exit_code == 0 and "support_diag" in result.output and "shrinkage" in result.output
