"""``clpo`` (control/clpo.py): the accuracy-EMA curriculum with answer-keeping template rewrites.

METHODS.md's test idea: easy problems are never rewritten; rewrites keep the answer.
"""

import pytest

from rollwise.control.base import PromptCursor
from rollwise.control.clpo import REWRITE, Clpo, ClpoConfig
from rollwise.tasks.rewrites import ModelRewriter, arith_rewrite, template_rewrite
from rollwise.control.stats import PromptStats
from rollwise.tasks.arith import make_prompt, value
from rollwise.types import Rollout, RolloutGroup


def group(prompt, correct):
    rs = []
    for c in correct:
        r = Rollout(prompt.id, [1], [2], [-1.0], [0], "stop", reward=float(c), score=float(c))
        rs.append(r)
    return RolloutGroup(prompt, rs)


class Stream:
    def get(self, index):
        return make_prompt(f"f{index}", 10 + index, "+", 5)


def controller(**cfg):
    return Clpo(ClpoConfig(**cfg), seed=0, num_generations=4, rewrite=template_rewrite)


def test_levels_by_the_accuracy_ema_by_hand():
    """ema .5: a prompt at 1.0 then 0.5 → .75 (medium); at 0 → hard; at 1 → easy; .8 exactly is easy."""
    c = controller()
    p, q, e, edge = (make_prompt(i, 12, "+", 7) for i in ("p", "q", "e", "edge"))
    c.observe_step([group(p, [1, 1, 1, 1]), group(q, [0, 0, 0, 0]), group(e, [1, 1, 1, 1]),
                    group(edge, [1, 1, 1, 1, 1])], PromptStats())
    c.observe_step([group(p, [1, 0, 1, 0]), group(edge, [1, 1, 1, 0, 0])], PromptStats())  # edge: .5·1 + .5·.6
    assert c.accuracy["p"] == pytest.approx(0.75) and c.accuracy["edge"] == pytest.approx(0.8)
    assert [c.level(i) for i in ("p", "q", "e", "edge")] == ["medium", "hard", "easy", "easy"]


def test_easy_prompts_are_never_rewritten():
    c = controller(rewrite_share=1.0)
    easy = [make_prompt(f"e{i}", 30 + i, "+", 4) for i in range(5)]
    c.observe_step([group(p, [1, 1, 1, 1]) for p in easy], PromptStats())
    chosen = c.select_prompts(PromptCursor(Stream(), 0), PromptStats(), 4)
    assert [p.id for p in chosen] == ["f0", "f1", "f2", "f3"]  # all fresh: nothing to rewrite


def test_medium_is_restated_and_hard_gets_a_given():
    c = controller(rewrite_share=0.5)
    medium, hard = make_prompt("m", 347, "-", 58), make_prompt("h", 347, "+", 58)
    c.observe_step([group(medium, [1, 0, 1, 0]), group(hard, [0, 0, 0, 0])], PromptStats())
    chosen = c.select_prompts(PromptCursor(Stream(), 0), PromptStats(), 4)
    assert [p.id for p in chosen[:2]] == ["f0", "f1"]
    by_id = {p.id: p for p in chosen[2:]}
    assert set(by_id) == {f"m{REWRITE}diversify", f"h{REWRITE}simplify"}
    assert by_id[f"h{REWRITE}simplify"].text == "347+58= 7+8+0=15"  # the first column given
    d = by_id[f"m{REWRITE}diversify"].columns
    assert d["a"] - d["b"] == 347 - 58 and d["a"] != 347  # (a + k) − (b + k)


@pytest.mark.parametrize("a,op,b", [(347, "+", 58), (91, "-", 905), (12, "*", 34), (5, "-", 5), (999, "+", 1)])
@pytest.mark.parametrize("kind", ["diversify", "simplify"])
def test_rewrites_keep_the_answer(a, op, b, kind):
    p = make_prompt("p", a, op, b)
    new = arith_rewrite(p, kind, shift=7)
    if new is None:
        assert kind == "simplify" and (op == "*" or max(a, b) < 10)  # no working (a product) or one column
        return
    assert new.answer == p.answer == str(value(a, op, b))
    assert value(new.columns["a"], new.columns["op"], new.columns["b"]) == value(a, op, b)


def test_a_rewrite_whose_first_four_agree_is_dropped():
    c = controller()
    rewrite = arith_rewrite(make_prompt("p", 12, "+", 7), "diversify", 1)
    rewrite.id = f"p{REWRITE}diversify"
    assert not c.accept(group(rewrite, [1, 1, 1, 1, 0, 0]))
    assert not c.accept(group(rewrite, [0, 0, 0, 0, 1]))
    assert c.accept(group(rewrite, [1, 0, 1, 1]))
    assert c.accept(group(make_prompt("p", 12, "+", 7), [1, 1, 1, 1]))  # an original: the curriculum keeps it
    assert c.metrics()["control/clpo_dropped"] == 2


def test_it_differs_from_no_control_and_resumes():
    """After a step with a hard prompt, clpo's next batch holds its rewrite; control.method=none's holds only
    fresh prompts. The state (EMA, seen prompts) survives a checkpoint."""
    c = controller()
    c.observe_step([group(make_prompt("h", 347, "+", 58), [0, 0, 0, 0])], PromptStats())
    chosen = [p.id for p in c.select_prompts(PromptCursor(Stream(), 0), PromptStats(), 4)]
    assert chosen == ["f0", "f1", "f2", f"h{REWRITE}simplify"]
    again = controller()
    again.load_state_dict(c.state_dict())
    assert again.accuracy == c.accuracy and again.seen["h"].text == "347+58="


class Scripted:
    """A judge backend that answers from a script (the judge interface's ``complete``)."""

    def __init__(self, *texts):
        self.texts, self.requests = list(texts), []

    def complete(self, texts):
        from rollwise.filter.judge_backends import JudgeReply

        self.requests += texts
        return [JudgeReply(self.texts.pop(0), prompt_tokens=10, completion_tokens=5) for _ in texts]


def test_model_written_rewrites_keep_the_answer_and_count_their_tokens():
    c = Clpo(ClpoConfig(rewrite_share=1.0), seed=0, num_generations=4,
             rewrite=ModelRewriter(Scripted("What is 58 plus 347?\nextra line", "")))
    hard, medium = make_prompt("h", 347, "+", 58), make_prompt("m", 12, "+", 7)
    c.observe_step([group(hard, [0, 0, 0, 0]), group(medium, [1, 0, 1, 0])], PromptStats())
    chosen = c.select_prompts(PromptCursor(Stream(), 0), PromptStats(), 2)
    assert len(chosen) == 2 and chosen[0].id == "f0"  # one empty reply: no rewrite, a fresh prompt instead
    rewrite = chosen[1]
    assert rewrite.text == "What is 58 plus 347?" and rewrite.answer in ("405", "19")
    assert rewrite.id.endswith(("diversify", "simplify"))
    assert c.metrics()["control/clpo_rewrite_tokens"] == 30


def test_a_rewriter_that_changes_the_answer_is_refused():
    def broken(prompt, kind, shift):
        return make_prompt(prompt.id, 1, "+", 1), 0

    c = Clpo(ClpoConfig(rewrite_share=1.0), seed=0, num_generations=4, rewrite=broken)
    c.observe_step([group(make_prompt("h", 347, "+", 58), [0, 0, 0, 0])], PromptStats())
    with pytest.raises(ValueError, match="changed its answer"):
        c.select_prompts(PromptCursor(Stream(), 0), PromptStats(), 1)


def test_model_rewriter_config_needs_a_judge():
    from rollwise.config import ConfigError
    from rollwise.train.config import load_run_config

    with pytest.raises(ConfigError, match="control.clpo.judge"):
        load_run_config(None, ["control.method=clpo", "control.clpo.rewriter=model"])


def test_a_run_steps_with_clpo(tmp_path):
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    overrides = [f"output_dir={tmp_path}", "task.max_digits=1", "task.eval_size=4", "control.method=clpo",
                 "rollout.prompts_per_step=4", "rollout.num_generations=4", "rollout.max_new_tokens=8",
                 "train.eval_samples=0", "model.threads=1", "train.steps=2", "train.eval_every=0",
                 "train.checkpoint_every=0"]
    trainer = Trainer(load_run_config(None, overrides))
    trainer.prepare()
    trainer.step()
    metrics = trainer.step()
    assert "control/clpo_rewritten" in metrics and metrics["control/clpo_hard"] >= 0


def test_clpo_is_a_ledger_arm():
    from rollwise.bench.ablate import arm_lines, default_arms

    assert "control:clpo" in default_arms()
    assert arm_lines("control:clpo") == ["control.method=clpo"]
