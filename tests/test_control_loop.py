"""Control in the loop, tiers 2 and 3: ``none`` is the loop as it was, every controller trains
with ``group`` and ``tree`` and does what it is for (a counter moved, a group was dropped, the
budget was spent exactly), bad combinations are ConfigErrors that name the fix, and
``rollwise list controllers`` lists them. Resume of controller state: tests/test_resume.py.
"""

import pytest
import torch
from typer.testing import CliRunner

from rollwise import seeds
from rollwise.config import ConfigError
from rollwise.control import CONTROLLERS
from rollwise.control.gdro import BINS, loss_at_stake
from rollwise.filter.rewards import score_groups
from rollwise.optim.batch import build_batch
from rollwise.optim.objective import assign_advantages
from rollwise.optim.update import UpdateSpec, policy_update
from rollwise.train.collect import RoundSampler
from rollwise.train.config import load_run_config
from rollwise.train.loop import Trainer

P, G = 4, 4


def trainer_for(tmp_path, warm, *extra) -> Trainer:
    sets = [f"output_dir={tmp_path}", f"model.path={warm}", "task.max_digits=1", "task.eval_size=8",
            "model.threads=1", "train.eval_samples=0", f"rollout.prompts_per_step={P}",
            f"rollout.num_generations={G}", "rollout.max_new_tokens=24", "optim.micro_batch_size=8",
            "optim.lr=1e-3", "train.eval_every=0", "train.checkpoint_every=0", *extra]
    t = Trainer(load_run_config(None, sets))
    t.prepare()
    return t


def record_groups(trainer):
    """Wrap the generator so every group it returns is kept (what the step trained on comes from these)."""
    seen, generate = [], trainer.generator.generate

    def wrapped(*args, **kwargs):
        groups, metrics = generate(*args, **kwargs)
        seen.append(groups)
        return groups, metrics

    trainer.generator.generate = wrapped
    return seen


def old_step(t: Trainer) -> dict:
    """The step as it was before control/ existed (commit e695216), stage by stage."""
    cfg = t.cfg
    n = t.generator.prompts_wanted(cfg.rollout.prompts_per_step)
    prompts = [t.tokenize(t.task.train.get(t.state.cursor + i)) for i in range(n)]
    t.state.cursor += n
    groups, metrics = t.generator.generate(t.engine, prompts, [cfg.rollout.num_generations] * n, seed=t.step_seed())
    metrics |= score_groups(groups, t.reward_fns)
    metrics |= assign_advantages(groups, cfg.objective)
    batch = build_batch(groups, t.tokenizer.pad_token_id, cfg.objective.mask_truncated_completions)
    o, r = cfg.optim, cfg.rollout
    spec = UpdateSpec(cfg.objective, passes=o.num_iterations, micro_batch_size=o.micro_batch_size,
                      max_grad_norm=o.max_grad_norm, max_len=r.max_new_tokens, temperature=r.temperature,
                      top_k=r.top_k, top_p=r.top_p, skip_zero_advantage=o.skip_zero_advantage,
                      logits_budget_mb=o.logits_budget_mb, packed=t.packed)
    metrics |= policy_update(t.model, t.optimizer, batch, spec, t.ref_model)
    t.scheduler.step()
    t.engine.load_weights(t.model)
    t.state.step += 1
    return metrics


@pytest.mark.parametrize("strategy", ["group", "tree"])
def test_none_is_the_loop_without_control(tmp_path, warm, strategy):
    """control.method=none (the default) samples the same completions and trains the same losses as
    the step before control/ existed."""
    with trainer_for(tmp_path, warm, "name=old", f"rollout.strategy={strategy}") as old, \
            trainer_for(tmp_path, warm, "name=new", f"rollout.strategy={strategy}", "control.method=none") as new:
        old_groups, new_groups = record_groups(old), record_groups(new)
        signal = []
        for _ in range(2):
            m_old, m_new = old_step(old), new.step()
            for key in ("loss", "grad_norm", "groups/zero_signal", "advantage/abs_mean"):
                assert m_new[key] == m_old[key], key
            signal.append(m_old["groups/zero_signal"] < 1)
        assert any(signal)  # the losses compared are real: some group carried a gradient
        completions = [[[[r.completion_ids for r in g.rollouts] for g in step] for step in steps]
                       for steps in (old_groups, new_groups)]
        assert completions[0] == completions[1] and len(completions[0]) == 2
        assert new.state.cursor == old.state.cursor == 2 * P
        new.checkpoint()
        assert not list(new.run_dir.glob("checkpoints/*/controller.pt"))  # none keeps the checkpoint layout


def attempts(t):
    return sum(r.attempts for r in t.stats.records.values())


CASES = {  # method -> extra settings, and what must have happened after two steps
    "dynamic_sampling": [],
    "vade": [],
    "xrpo_alloc": ["control.xrpo_alloc.initial=2", "control.xrpo_alloc.chunk=2"],
    "gdro": [],
    "dars": [],
    "difficulty_select": [],
    "arrol": ["control.arrol.min_examples=16"],
}


@pytest.mark.parametrize("strategy", ["group", "tree", "latr"])
@pytest.mark.parametrize("method", list(CASES))
def test_every_controller_trains_with_every_strategy(tmp_path, warm, method, strategy):
    if method == "arrol" and strategy != "group":  # arrol over-provisions independent samples: refused, with the fix
        with pytest.raises(ConfigError, match="rollout.strategy=group"):
            trainer_for(tmp_path, warm, f"control.method={method}", f"rollout.strategy={strategy}")
        return
    with trainer_for(tmp_path, warm, f"control.method={method}", f"rollout.strategy={strategy}",
                     *CASES[method]) as t:
        seen = record_groups(t)
        ms = [t.step() for _ in range(2)]
        assert t.state.step == 2 and all(m["tokens/generated"] > 0 for m in ms)
        spent = attempts(t)  # rollouts scored over both steps (PromptStats counts every one)
        if method in ("vade", "gdro", "difficulty_select"):
            assert spent == 2 * P * G  # selectors and allocators spend exactly the budget
        if method == "xrpo_alloc":
            assert spent == 2 * P * G and all(m["control/extend_rollouts"] == P * (G - 2) for m in ms)
            assert all(m["control/rollouts_max"] <= 4 * G for m in ms)
        if method == "gdro":  # step 0: nothing observed, every candidate unseen; its groups score the unseen bin
            assert all(ms[0][f"control/bin_weight/{b}"] == pytest.approx(0.2) for b in BINS)
            assert ms[0]["control/bin_drawn/unseen"] == P and sum(ms[1][f"control/bin_drawn/{b}"] for b in BINS) == P
            first = [g for groups in seen[:1] for g in groups]  # step 0's only round
            assert ms[0]["control/bin_score/unseen"] == pytest.approx(
                sum(loss_at_stake(g.rewards) for g in first) / len(first))
        if method == "vade":
            assert ms[1]["control/pool"] > P and len(t.stats) >= 2 * P
        if method == "difficulty_select":
            assert "control/estimated_pass_rate" in ms[1] and len(t.controller.reference) == 2 * P
            # step 1 embedded 4P candidates + P references; the budget counts those tokens with the sampled ones
            assert ms[0]["control/embed_tokens"] == 0 and ms[1]["control/embed_tokens"] > 4 * P
            assert t.state.generated_tokens == t.engine.stats.decode_tokens + ms[1]["control/embed_tokens"]
            assert ms[1]["tokens/generated"] > ms[1]["control/embed_tokens"]
            assert t.embed_model is not None and t.embed_model is not t.model  # the starting weights, frozen:
            assert any(not torch.equal(a, b) for a, b in zip(t.model.parameters(), t.embed_model.parameters()))
        if method == "dars":
            assert all("control/extend_rounds" in m for m in ms)
            assert spent == 2 * P * G + sum(m["control/extend_rollouts"] for m in ms)
            assert sum(m["control/extend_rollouts"] for m in ms) > 0  # some prompt was hard
        if method == "arrol":  # the probe was fit on every scored rollout of both steps
            assert ms[1]["control/probe_examples"] == 2 * P * G and t.controller.w is not None
            assert ms[0]["arrol/pruning"] == 0 and spent == 2 * P * G  # no probe yet at step 0; survivors only
        if method == "dynamic_sampling":
            dropped = sum(m["control/dropped_groups"] for m in ms)
            assert dropped > 0  # some group came back flat and was dropped
            generated_groups = sum(m["control/dropped_groups"] + m["control/kept_groups"] for m in ms)
            assert spent == G * generated_groups and generated_groups > 2 * P  # refills were rolled out
            for m in ms:  # trained on informative groups only, unless the cap was hit
                assert m["groups/zero_signal"] == 0 or m["control/cap_hit"] == 1


def test_arrol_prunes_once_its_probe_is_ready(tmp_path, warm):
    """Once the probe passes its AUC bar the next step starts 2G per prompt and keeps G (unlike
    control.method=none, which samples G and keeps them all); the pruned rollouts stop at the
    pruning point, a quarter of rollout.max_new_tokens (24 -> 6 tokens), and leave nothing behind."""
    with trainer_for(tmp_path, warm, "control.method=arrol", *CASES["arrol"]) as t:
        first = t.step()
        assert first["arrol/pruning"] == 0 and t.controller.w is not None  # fit on step 0's 16 rollouts
        t.controller.held_out_auc = 1.0  # as if the held-out rollouts had been ranked perfectly
        assert t.controller.ready() and t.controller.segment_len == 6
        aborted = t.engine.stats.aborted_tokens
        m = t.step()
        assert m["arrol/pruning"] == 1 and m["arrol/pruned_rollouts"] == P * G  # 2G started, G kept, per prompt
        assert attempts(t) == 2 * P * G  # only survivors were scored and trained
        assert 0 < t.engine.stats.aborted_tokens - aborted <= m["arrol/pruned_tokens"]
        assert m["arrol/pruned_tokens"] <= P * G * 6  # each cut at the pruning point, not run to 24 tokens


@pytest.mark.parametrize("strategy", ["group", "tree"])
@pytest.mark.parametrize("method", ["xrpo_alloc", "dars"])
def test_extra_rounds_reuse_the_cached_prompt_prefix(tmp_path, warm, method, strategy, monkeypatch):
    """An extend round samples prompts the step already prefilled: each extra rollout feeds one
    prompt token (the prefix is copied from the engine's kept prefixes), none is prefilled again."""
    with trainer_for(tmp_path, warm, f"control.method={method}", f"rollout.strategy={strategy}",
                     *CASES[method]) as t:
        rounds, run, prefill = [], RoundSampler.sample, t.engine.forward.prefill
        prefilled = []  # prompt tokens run through a model prefill, per call

        def counting_prefill(kv, ids, lens, row0, start=0):
            prefilled.append(sum(lens))
            return prefill(kv, ids, lens, row0, start)

        def spy(sampler, prompts, budgets, salt=seeds.FIRST_ROUND):
            stats, before = t.engine.stats, (len(prefilled), t.engine.stats.prefix_cache_tokens)
            out = run(sampler, prompts, budgets, salt)
            rounds.append((salt, prompts, budgets, prefilled[before[0]:], stats.prefix_cache_tokens - before[1]))
            return out

        t.engine.forward.prefill = counting_prefill
        monkeypatch.setattr(RoundSampler, "sample", spy)
        for _ in range(4):  # DARS extends only when some prompt came back hard
            m = t.step()
            assert not t.engine._prefixes  # forgotten at the step's end
            if any(seeds.is_extend_round(r[0]) for r in rounds):
                break
        assert rounds[0][3], "the first round prefilled its prompts"
        extra = [r for r in rounds if seeds.is_extend_round(r[0])]
        assert extra, "the controller ran no extend round"
        for _, prompts, budgets, calls, reused in extra:
            kept = [(p, b) for p, b in zip(prompts, budgets) if b > 0]
            assert calls == []  # no prefill ran: every prompt's prefix came from the kept cache
            if strategy == "group":  # requests with one prompt's ids are one family: one hit, the rest copy it
                assert reused == sum(len(ids) - 1 for ids in {tuple(p.token_ids) for p, _ in kept})
            else:  # a request forked while queued per prompt (and fallback roots): at least one hit each
                assert reused >= sum(len(p.token_ids) - 1 for p, _ in kept)
        assert m["control/prefix_reused_tokens"] >= sum(r[4] for r in extra) > 0


def test_bad_combinations_are_config_errors(tmp_path):
    def cfg(*sets):
        return load_run_config(None, [f"output_dir={tmp_path}", "model.threads=1", *sets])

    with pytest.raises(ConfigError, match=r"control.method=vade with rollout.strategy=april.*rollout.strategy=group"):
        Trainer(cfg("control.method=vade", "rollout.strategy=april"))
    with pytest.raises(ConfigError, match=r"control.xrpo_alloc.initial=6 exceeds rollout.num_generations=4"):
        Trainer(cfg("control.method=xrpo_alloc", "control.xrpo_alloc.initial=6", "rollout.num_generations=4"))
    with pytest.raises(ConfigError, match=r"control.gdro.min_rollouts"):
        Trainer(cfg("control.method=gdro", "control.gdro.min_rollouts=5", "rollout.num_generations=4"))
    with pytest.raises(ConfigError, match=r"'control.vade.visit_decayy'; did you mean 'control.vade.visit_decay'"):
        cfg("control.vade.visit_decayy=0.5")
    with pytest.raises(ConfigError, match=r"control.method"):
        cfg("control.method=vadee")


def test_list_controllers():
    from rollwise.cli import app

    result = CliRunner().invoke(app, ["list", "controllers"])
    assert result.exit_code == 0, result.output
    for name in CONTROLLERS:
        assert name in result.output


def test_dars_breadth_runs_two_optimizer_passes(tmp_path, warm, monkeypatch):
    import rollwise.train.loop as loop

    seen, update = [], loop.policy_update

    def spy(model, optimizer, batch, spec, ref_model=None):
        seen.append(spec.passes)
        return update(model, optimizer, batch, spec, ref_model)

    monkeypatch.setattr(loop, "policy_update", spy)
    with trainer_for(tmp_path, warm, "control.method=dars", "control.dars.breadth=true") as t:
        t.step()
    with trainer_for(tmp_path, warm, "name=plain", "control.method=dars") as t:
        t.step()
    assert seen == [2, 1]


class StopOddSecondToken:
    """A user's controller: stops a rollout whose second token id is odd (asked every 2 tokens)."""

    @staticmethod
    def make(seed, num_generations):
        from rollwise.control import Controller

        class Gate(Controller):
            name, continue_every = "odd_gate", 2

            def __init__(self, **kw):
                super().__init__(**kw)
                self.asked = []

            def should_continue(self, partial, stats):
                self.asked.append((partial.prompt.id, list(partial.token_ids)))
                return len(partial.token_ids) < 2 or partial.token_ids[1] % 2 == 0

        return Gate(seed=seed, num_generations=num_generations)


def test_should_continue_stops_rollouts_during_generation(tmp_path, warm):
    """A controller's should_continue is asked at every 2 tokens; the rollouts it stops are aborted
    in the engine and appear in no group; a prompt's last rollout is never stopped."""
    with trainer_for(tmp_path, warm, "rollout.engine=slots") as t:
        t.set_controller(StopOddSecondToken.make(t.cfg.seed, G))
        seen = record_groups(t)
        m = t.step()
        gate = t.controller
        asked_at = {len(ids) for _, ids in gate.asked}
        assert asked_at and all(n % 2 == 0 for n in asked_at)  # only at segment boundaries
        odd = [ids for _, ids in gate.asked if len(ids) == 2 and ids[1] % 2]
        assert odd, "the gate never had a rollout to stop (test data too easy)"
        assert m["control/stopped_rollouts"] == t.engine.stats.aborted > 0
        (groups,) = seen
        assert all(len(g.rollouts) >= 1 for g in groups)
        stopped_prompts = {pid for pid, ids in gate.asked if len(ids) == 2 and ids[1] % 2}
        for g in groups:
            odd_kept = [r for r in g.rollouts if len(r.completion_ids) >= 2 and r.completion_ids[1] % 2]
            assert len(odd_kept) <= (1 if len(g.rollouts) == 1 else 0)  # only a prompt's last one survives
        assert sum(len(g.rollouts) for g in groups) == P * G - m["control/stopped_rollouts"]
        assert stopped_prompts
        assert m["tokens/generated"] == t.engine.stats.decode_tokens  # stopped tokens were sampled: counted
        assert t.state.step == 1


def test_should_continue_needs_the_group_strategy(tmp_path, warm):
    with trainer_for(tmp_path, warm, "rollout.strategy=tree") as t:
        with pytest.raises(ConfigError, match="should_continue.*rollout.strategy=group"):
            t.set_controller(StopOddSecondToken.make(t.cfg.seed, G))
