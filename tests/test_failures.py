"""Failures are data, not training signal (issue 32, items 2, 5, 6 and 7's optimizer side).

- a non-finite reward (reward function, environment, OpenEnv, harness) scores 0 with the reason
  ``non-finite`` and is counted; a non-finite loss or gradient norm skips the optimizer step;
- a failed rollout has no loss weight and stays out of its group's statistics;
- reward functions read the final assistant turn (``completions``) and the episode (``completion_messages``);
- sequence-mean normalisers count sampled tokens (not inserted ids), and an episode once.
"""

import copy
import math

import pytest
import torch

from rollwise.control import PromptStats
from rollwise.control.dynamic_sampling import DynamicSampling, DynamicSamplingConfig
from rollwise.filter.rewards import ENV_REWARD, RewardFn, score_groups
from rollwise.optim.batch import build_batch
from rollwise.optim.losses import token_weights
from rollwise.optim.objective import ObjectiveConfig, assign_advantages
from rollwise.optim.update import UpdateSpec, policy_update
from rollwise.types import Prompt, Rollout, RolloutGroup, Turn

NON_FINITE = [float("nan"), float("inf"), float("-inf")]
OBJECTIVE = ObjectiveConfig(tis_mode="none")  # GRPO; made-up behaviour log-probs must not mask sequences


def _rollout(ids=(5, 6), reward=0.0, failure=None, text="x", **kw):
    n = len(ids)
    return Rollout("p", [1, 2], list(ids), [-1.0] * n, [0] * n, "stop", completion_text=text, reward=reward,
                   score=reward, failure=failure, **kw)


def _group(*rollouts, answer="4", messages=None):
    return RolloutGroup(Prompt("p", "2+2=", answer=answer, messages=messages), list(rollouts))


# -- item 2: non-finite rewards score 0 ------------------------------------------------------------
@pytest.mark.parametrize("bad", [*NON_FINITE, "many", object()], ids=["nan", "inf", "-inf", "str", "object"])
def test_a_non_finite_reward_function_value_scores_zero_and_is_counted(bad):
    g = _group(_rollout(), _rollout())
    metrics = score_groups([g], [RewardFn("f", lambda completions, **_: [bad, 1.0])])
    assert g.rewards == [0.0, 1.0]
    assert g.rollouts[0].reward_components["f"] == 0.0
    assert g.rollouts[0].reward_reasons["f"].startswith("non-finite")
    assert metrics["reward/f/non_finite"] == 1.0 and metrics["reward/f/errors"] == 0.0


@pytest.mark.parametrize("bad", NON_FINITE)
def test_a_non_finite_environment_or_harness_reward_scores_zero_and_is_counted(bad):
    # env_reward carries get_reward(), an OpenEnv server's reward and a harness's return alike
    g = _group(_rollout(env_reward=bad), _rollout(env_reward=1.0))
    metrics = score_groups([g], [RewardFn("ok", lambda completions, **_: [0.5, 0.5])])
    assert g.rewards == [0.5, 1.5] and all(math.isfinite(r) for r in g.rewards)
    assert g.rollouts[0].reward_components[ENV_REWARD] == 0.0
    assert g.rollouts[0].reward_reasons[ENV_REWARD].startswith("non-finite")
    assert metrics[f"reward/{ENV_REWARD}/non_finite"] == 1.0


def test_finite_components_that_overflow_score_zero():
    g = _group(_rollout())
    score_groups([g], [RewardFn("a", lambda completions, **_: [1e308], weight=10.0)])
    assert g.rewards == [0.0] and g.rollouts[0].reward_reasons["total"].startswith("non-finite")


# -- item 2: a non-finite update never reaches the weights -------------------------------------------
def _batch(tok, rewards=(1.0, 0.0, 1.0, 0.0)):
    ids = list(range(4, 20))
    rollouts = [Rollout("p", ids[:3], ids[3 + i: 8 + i], [-1.0] * 5, [0] * 5, "stop", reward=r, score=r)
                for i, r in enumerate(rewards)]
    groups = [RolloutGroup(Prompt("p", "x"), rollouts)]
    assign_advantages(groups, ObjectiveConfig())
    return build_batch(groups, tok.pad_token_id)


def _update_with(model, tok, batch, hook=None):
    m = copy.deepcopy(model)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    if hook is not None:
        hook(m)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    metrics = policy_update(m, opt, batch, UpdateSpec(OBJECTIVE, micro_batch_size=2, max_len=8))
    changed = any(not torch.equal(before[n], p) for n, p in m.named_parameters())
    return m, opt, metrics, changed


def test_a_non_finite_loss_skips_the_update(tiny):
    model, tok = tiny
    _, _, metrics, changed = _update_with(model, tok, _batch(tok))
    assert changed and metrics["update/skipped_nonfinite"] == 0  # the same batch, finite: a real step
    batch = _batch(tok)
    batch.advantages[0, batch.completion_mask[0] > 0] = float("nan")  # as a NaN reward used to make them
    m, opt, metrics, changed = _update_with(model, tok, batch)
    assert not changed and metrics["update/skipped_nonfinite"] == 1
    assert opt.state == {}  # AdamW never stepped: no moments, no step count
    assert all(p.grad is None for p in m.parameters())  # the bad gradient was dropped


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_a_non_finite_gradient_skips_the_update_and_the_next_one_is_clean(tiny, bad):
    model, tok = tiny

    def poison(m):  # the loss stays finite; one parameter's gradient does not
        p = next(m.parameters())
        p.register_hook(lambda g: g * bad)

    m, opt, metrics, changed = _update_with(model, tok, _batch(tok), poison)
    assert not changed and metrics["update/skipped_nonfinite"] == 1
    # two passes, the first poisoned only: the second steps from the untouched weights
    m = copy.deepcopy(model)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    calls = []
    next(m.parameters()).register_hook(lambda g: (calls.append(1), g * bad if len(calls) == 1 else g)[1])
    metrics = policy_update(m, opt, _batch(tok), UpdateSpec(OBJECTIVE, passes=2, micro_batch_size=8, max_len=8))
    assert metrics["update/skipped_nonfinite"] == 1
    assert all(torch.isfinite(p).all() for p in m.parameters())
    assert all(s["step"] == 1 for s in opt.state.values())


class NaNRewardEnv:
    """An environment whose ``get_reward()`` is NaN (the issue's reproduction)."""

    def reset(self, **row):
        return None

    def get_reward(self):
        return float("nan")


def test_an_environment_returning_nan_never_reaches_the_checkpoint(tmp_path):
    from safetensors.torch import load_file

    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer
    from rollwise.train.metrics import read_metrics
    from rollwise.train.state import RunLimits

    cfg = load_run_config(None, [f"output_dir={tmp_path}", "task.max_digits=2", "task.eval_size=2",
                                 "rollout.prompts_per_step=2", "rollout.num_generations=4",
                                 "rollout.max_new_tokens=12", "rollout.environment=test_failures:NaNRewardEnv",
                                 "optim.micro_batch_size=8", "model.threads=1", "train.eval_samples=0",
                                 "train.eval_every=0", "train.checkpoint_every=1", "optim.lr=1e-2"])
    with Trainer(cfg) as trainer:
        trainer.prepare()
        # a reward with signal for a random model (even length), so the update is a real one
        trainer.reward_fns = [RewardFn("even", lambda completions, **_: [float(len(c) % 2 == 0) for c in completions])]
        trainer.fit(RunLimits(steps=2))
        run_dir = trainer.run_dir
    for step in (1, 2):
        weights = load_file(str(run_dir / "checkpoints" / f"step_{step:06d}" / "model.safetensors"))
        assert all(torch.isfinite(t).all() for t in weights.values()), f"step {step}: non-finite weights"
    rows = [m for m in read_metrics(run_dir) if "reward/environment/non_finite" in m]
    assert len(rows) == 2 and all(m["reward/environment/non_finite"] == 8 for m in rows)
    assert all(m["train/skipped_updates"] == 0 for m in rows)  # caught at scoring: no update had to be skipped


# -- item 5: failed episodes do not train --------------------------------------------------------------
@pytest.mark.parametrize("method", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline", "drpo"])
def test_a_failed_rollout_trains_nothing_and_stays_out_of_its_group(method):
    cfg = ObjectiveConfig(method=method)
    with_failed = _group(_rollout(reward=1.0), _rollout(reward=0.0), _rollout(reward=0.0, failure="harness raised"),
                         _rollout(reward=1.0))
    without = _group(_rollout(reward=1.0), _rollout(reward=0.0), _rollout(reward=1.0))
    assign_advantages([with_failed], cfg)
    assign_advantages([without], cfg)
    live = [r.advantage for i, r in enumerate(with_failed.rollouts) if i != 2]
    assert live == [r.advantage for r in without.rollouts]
    assert with_failed.rollouts[2].advantage == [0.0, 0.0]
    batch = build_batch([with_failed], pad_token_id=0)
    assert batch.loss_weights[2].sum() == 0 and (batch.loss_weights[[0, 1, 3]].sum(-1) == 2).all()
    assert batch.num_sequences == 3


def test_grpo_advantages_of_a_group_with_a_failed_rollout_by_hand():
    # [1, 0, failed, 1]: the live three are GRPO's [1, 0, 1]: mean 2/3, Bessel std 1/sqrt(3)
    g = _group(_rollout(reward=1.0), _rollout(reward=0.0), _rollout(reward=0.0, failure="timeout"),
               _rollout(reward=1.0))
    assign_advantages([g], ObjectiveConfig(method="grpo"))
    expected = [(1 - 2 / 3) * math.sqrt(3), (0 - 2 / 3) * math.sqrt(3), 0.0, (1 - 2 / 3) * math.sqrt(3)]
    assert [r.advantage[0] for r in g.rollouts] == pytest.approx(expected, rel=1e-5)


def test_a_failed_harness_episode_trains_none_of_its_segments():
    seg = _rollout(ids=(7, 8, 9))
    g = _group(_rollout(reward=1.0), _rollout(reward=0.0), _rollout(failure="harness timed out", segments=[seg]))
    assign_advantages([g], ObjectiveConfig())
    batch = build_batch([g], pad_token_id=0)
    assert len(batch) == 4 and batch.loss_weights[2:].sum() == 0  # the failed rollout and its segment
    assert batch.sequence_ids.tolist() == [0, 1, -1, -1]


def test_a_group_whose_live_rollouts_agree_has_no_signal():
    # [1, 1, failed 0]: the failure is not a contrast; dynamic sampling drops it, stats leave it out
    g = _group(_rollout(reward=1.0), _rollout(reward=1.0), _rollout(reward=0.0, failure="server died"))
    metrics = assign_advantages([g], ObjectiveConfig())
    assert metrics["groups/zero_signal"] == 1.0 and all(a == 0 for r in g.rollouts for a in r.advantage)
    assert not DynamicSampling(DynamicSamplingConfig()).accept(g)
    stats = PromptStats()
    stats.observe(g, step=0)
    rec = stats.get("p")
    assert (rec.attempts, rec.successes, rec.group_std) == (2, 2, 0.0)


def test_failed_episodes_are_counted():
    from rollwise.train.metrics import rollout_metrics

    g = _group(_rollout(reward=1.0), _rollout(failure="harness raised"), _rollout(failure="reset raised"))
    assert rollout_metrics([g])["episodes/failed"] == 2.0


def test_every_rollout_of_a_batch_failed():
    g = _group(_rollout(failure="a"), _rollout(failure="b"))
    assign_advantages([g], ObjectiveConfig())
    batch = build_batch([g], pad_token_id=0)
    assert batch.loss_weights.sum() == 0 and batch.num_sequences == 0


# -- item 6: what reward functions read --------------------------------------------------------------
EPISODE = [{"role": "assistant", "content": "<tool_call>6*7</tool_call>"}, {"role": "tool", "content": "42"},
           {"role": "assistant", "content": "I am not sure."}]
JOINED = "<tool_call>6*7</tool_call>42I am not sure."  # what reward functions used to read


def _spy():
    seen = {}

    def fn(prompts, completions, completion_ids, completion_messages, **_):
        seen.update(completions=completions, messages=completion_messages)
        return [0.0] * len(completions)

    return fn, seen


def test_plain_prompts_read_the_final_assistant_turn_and_the_episode():
    fn, seen = _spy()
    episode = _rollout(text=JOINED, messages=EPISODE)
    single = _rollout(text="#4")
    score_groups([_group(episode, single)], [RewardFn("spy", fn)])
    assert seen["completions"] == ["I am not sure.", "#4"]
    assert seen["messages"] == [EPISODE, None]


def test_conversational_prompts_read_the_final_turn_as_one_assistant_message():
    fn, seen = _spy()
    episode = _rollout(text="ignored", messages=EPISODE)
    score_groups([_group(episode, messages=[{"role": "user", "content": "6*7?"}])], [RewardFn("spy", fn)])
    assert seen["completions"] == [[{"role": "assistant", "content": "I am not sure."}]]
    assert seen["messages"] == [EPISODE]


def test_the_tool_output_is_not_the_answer():
    # the calculator said 42; the model's final turn gave no answer: a lenient verifier reading everything took 42
    from rollwise.filter.math_answer import math_answer

    g = _group(_rollout(text=JOINED, messages=EPISODE), answer="42")
    score_groups([g], [RewardFn("math", math_answer)])
    assert g.rewards == [0.0]


# -- item 7: normalisers count sampled tokens, an episode once ------------------------------------------
def test_sequence_mean_divides_by_sampled_tokens_not_inserted_ids():
    # an episode of 6 ids: turns [0, 2) and [4, 6), ids 2-3 inserted by the tool (weight 0); a plain rollout of 2
    episode = _rollout(ids=(5, 6, 7, 8, 9, 10), turns=[Turn(0, 2), Turn(4, 6)], loss_weights=[1, 1, 0, 0, 1, 1])
    g = _group(episode, _rollout(ids=(5, 6)))
    for r in g.rollouts:
        r.advantage = [1.0] * r.num_tokens
    batch = build_batch([g], pad_token_id=0)
    assert batch.sequence_lengths.tolist() == [4.0, 2.0] and batch.num_sequences == 2
    w = token_weights(batch.loss_weights, "seq_mean_token_mean", lengths=batch.normaliser_lengths,
                      num_sequences=batch.num_sequences)
    # each sequence's trained tokens sum to 1/N: the episode's four at 1/(4*2), the plain two at 1/(2*2)
    assert w.sum(-1).tolist() == pytest.approx([0.5, 0.5])
    assert w[0][w[0] > 0].tolist() == pytest.approx([1 / 8] * 4)
    tm = token_weights(batch.loss_weights, "token_mean")  # token-mean: the 6 trained tokens
    assert tm.sum() == pytest.approx(1.0) and tm[tm > 0].tolist() == pytest.approx([1 / 6] * 6)


def test_an_episode_of_several_segments_weighs_one_sequence():
    # a harness episode: main segment (3 sampled) + 4 segments of 2 sampled each = 11 tokens, one sequence
    segments = [_rollout(ids=(7, 8), turns=[Turn(0, 2)]) for _ in range(4)]
    episode = _rollout(ids=(5, 6, 9), turns=[Turn(0, 3)], segments=segments)
    g = _group(episode, _rollout(ids=(5, 6)))
    for r in (*g.rollouts, *segments):
        r.advantage = [1.0] * r.num_tokens
    batch = build_batch([g], pad_token_id=0)
    assert len(batch) == 6 and batch.num_sequences == 2
    assert batch.sequence_ids.tolist() == [0, 0, 0, 0, 0, 1]
    for agg, max_len in (("seq_mean_token_mean", None), ("seq_mean_token_sum_norm", 4)):
        w = token_weights(batch.loss_weights, agg, max_len, lengths=batch.normaliser_lengths,
                          num_sequences=batch.num_sequences)
        episode_weight, plain_weight = float(w[:5].sum()), float(w[5].sum())
        if agg == "seq_mean_token_mean":  # each sequence 1/N, however many rows it spans
            assert (episode_weight, plain_weight) == pytest.approx((0.5, 0.5))
        else:  # Dr.GRPO: every token 1/(N * max_len), N = 2 sequences (not 6 rows)
            assert w[w > 0].tolist() == pytest.approx([1 / 8] * 13)


def test_policy_update_normalises_an_episode_once(tiny):
    """Through policy_update: an episode split into two segment rows trains as the same episode in
    one row would (same tokens, same advantage) — its segments do not weigh two sequences."""
    model, tok = tiny
    ids = list(range(4, 16))
    whole = Rollout("p", ids[:3], ids[3:9], [-1.0] * 6, [0] * 6, "stop", reward=1.0, score=1.0, turns=[Turn(0, 6)])
    other = Rollout("p", ids[:3], ids[5:8], [-1.0] * 3, [0] * 3, "stop", reward=0.0, score=0.0)
    first = Rollout("p", ids[:3], ids[3:6], [-1.0] * 3, [0] * 3, "stop", reward=1.0, score=1.0, turns=[Turn(0, 3)])
    second = Rollout("p", ids[:6], ids[6:9], [-1.0] * 3, [0] * 3, "stop", turns=[Turn(0, 3)])
    first.segments = [second]
    grads = []
    for main in (whole, first):
        g = RolloutGroup(Prompt("p", "x"), [main, copy.deepcopy(other)])
        assign_advantages([g], ObjectiveConfig())
        m = copy.deepcopy(model)
        opt = torch.optim.SGD(m.parameters(), lr=0.0)
        policy_update(m, opt, build_batch([g], tok.pad_token_id), UpdateSpec(OBJECTIVE, max_len=8, max_grad_norm=1e9))
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
    # the prefix of the second segment is the first segment's tokens: the same log-probs, the same loss
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)


def test_micro_batches_and_devices_keep_the_sequence_bookkeeping():
    g = _group(_rollout(reward=1.0, segments=[_rollout(ids=(7, 8, 9))]), _rollout(failure="x"))
    assign_advantages([g], ObjectiveConfig())
    batch = build_batch([g], pad_token_id=0)
    sub = batch.select(torch.tensor([1, 2])).to("cpu")
    assert sub.sequence_ids.tolist() == [0, -1] and sub.sequence_lengths.tolist() == [5.0, 2.0]
    legacy = copy.copy(batch)
    legacy.sequence_ids = legacy.sequence_lengths = None  # a batch built by older code: every row a sequence
    assert legacy.to("cpu").num_sequences == 3 and legacy.normaliser_lengths.tolist() == [2.0, 3.0, 2.0]


# the LR schedule still advances once per training step: torch warns that no optimizer step preceded it
@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
def test_a_step_whose_update_is_not_finite_is_skipped_counted_and_checkpointed_unchanged(tmp_path, monkeypatch):
    """Past the scoring guard (here: advantages forced to NaN), the loop still never applies or saves
    a non-finite update: the checkpoint holds the weights before it, the run-long counter advances."""
    from safetensors.torch import load_file

    import rollwise.train.loop as loop
    from rollwise.train.config import load_run_config
    from rollwise.train.metrics import read_metrics
    from rollwise.train.state import RunLimits

    def nan_advantages(groups, cfg):
        metrics = assign_advantages(groups, cfg)
        for r in (r for g in groups for r in g.rollouts):
            r.advantage = [float("nan")] * len(r.advantage)
        return metrics

    monkeypatch.setattr(loop, "assign_advantages", nan_advantages)
    cfg = load_run_config(None, [f"output_dir={tmp_path}", "task.max_digits=2", "task.eval_size=2",
                                 "rollout.prompts_per_step=2", "rollout.num_generations=4", "rollout.max_new_tokens=8",
                                 "optim.micro_batch_size=8", "model.threads=1", "train.eval_samples=0",
                                 "train.eval_every=0", "train.checkpoint_every=1", "optim.skip_zero_advantage=false"])
    with loop.Trainer(cfg) as trainer:
        trainer.prepare()
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.fit(RunLimits(steps=2))
        saved = load_file(str(trainer.run_dir / "checkpoints" / "step_000002" / "model.safetensors"))
        assert all(torch.equal(saved[n], t) for n, t in before.items() if n in saved)
        assert trainer.state.skipped_updates == 2
    assert [m["train/skipped_updates"] for m in read_metrics(trainer.run_dir) if "train/skipped_updates" in m] == [1, 2]
