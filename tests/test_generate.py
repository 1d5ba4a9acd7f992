"""Rollout strategies: tree (TreePO), latr (LATR), april (APRIL) on the slot engine, and in the trainer.

The tiny model's matrices are re-drawn at std .15 (as in the engine tests) so sampled
completions vary in length and end in EOS.
"""

from dataclasses import replace

import pytest
import torch

from rollwise.engine.engine import Completion, Request
from rollwise.engine.sampling import SamplingParams
from rollwise.engine.slots import SlotEngine
from rollwise.engine.state import PartialState, child_seed
from rollwise.generate.april import AprilConfig, AprilSampler
from rollwise.generate.forest import Forest
from rollwise.generate.latr import LatrConfig, LatrSampler, jaccard
from rollwise.generate.tree import TreeConfig, TreeSampler, repeats
from rollwise.train.config import load_run_config
from rollwise.train.loop import Trainer
from rollwise.types import Prompt

TEXTS = ["12+3=", "hello world", "a", "99*9=", "zz top", "q"]
G = 8


@pytest.fixture(scope="module")
def prompts(tiny):
    _, tok = tiny
    return [Prompt(id=str(i), text=t, token_ids=tok(t)["input_ids"]) for i, t in enumerate(TEXTS)]


def engine_for(tiny, slots=256):
    model, tok = tiny
    return SlotEngine(model, pad_token_id=tok.pad_token_id, max_batch_size=slots)


def params_for(tiny, max_new_tokens=40, **kw):
    _, tok = tiny
    return SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=(tok.eos_token_id,), **kw)


def decode(ids):
    return ""


def check_tree_group(group):
    """Every leaf is the concatenation of its path's node spans; shared nodes hold identical tokens."""
    tree = group.tree
    span_tokens = {}
    for r in group.rollouts:
        path = r.node_path
        assert path[0] == 0 and tree.nodes[path[-1]].end == len(r.completion_ids)
        for parent, child in zip(path, path[1:]):
            node = tree.nodes[child]
            assert node.parent == parent and node.start == tree.nodes[parent].end  # contiguous spans
            seg = r.completion_ids[node.start : node.end]
            assert span_tokens.setdefault(child, seg) == seg  # every leaf below a node agrees on it
        assert not tree.nodes[path[-1]].children  # a leaf
    return span_tokens


# -- tree (TreePO) ---------------------------------------------------------------------------
def test_tree_leaves_are_path_concatenations_and_shared_prefixes_computed_once(tiny, prompts):
    engine = engine_for(tiny)
    sampler = TreeSampler(params_for(tiny), decode, TreeConfig(segment_len=4, max_depth=3, repeat_ngram=0))
    groups, metrics = sampler.generate(engine, prompts, [G] * len(prompts), seed=1)
    unique = 0
    for g in groups:
        assert len(g.rollouts) == G  # the leaf budget, filled (fallback) and never exceeded
        spans = check_tree_group(g)
        assert sum(len(s) for s in spans.values()) == g.tree.unique_tokens
        unique += g.tree.unique_tokens
    assert metrics["tree/forks"] > 0
    assert metrics["tree/shared_token_ratio"] > 0
    # the engine sampled each node's tokens once; forks copied prefixes instead of recomputing them
    stats = engine.stats
    assert stats.decode_tokens == unique
    assert stats.reprefill_tokens == 0
    assert stats.prefix_tokens_shared > 0


def test_tree_prefill_counts_one_prompt_per_round_of_roots(tiny, prompts, monkeypatch):
    engine = engine_for(tiny)
    sampler = TreeSampler(params_for(tiny), decode, TreeConfig(segment_len=6, max_depth=2, repeat_ngram=0))
    started = []  # prompt index of every round of root samples (the first, then fallbacks)
    original = Forest.start

    def counting_start(self, pi, n, **kw):
        started.append(pi)
        return original(self, pi, n, **kw)

    monkeypatch.setattr(Forest, "start", counting_start)
    groups, _ = sampler.generate(engine, prompts, [G] * len(prompts), seed=3)
    assert len(started) > len(prompts)  # this config needs fallback rounds (short completions)
    assert engine.stats.prefill_tokens == sum(len(prompts[pi].token_ids) for pi in started)
    assert engine.stats.decode_tokens == sum(g.tree.unique_tokens for g in groups)
    assert all(len(g.rollouts) == G for g in groups)


def test_tree_without_branching_gives_independent_samples(tiny, prompts):
    """branch_factor=1: G root samples, each exactly the request it would be alone (no shared randomness)."""
    params = params_for(tiny)
    sampler = TreeSampler(params, decode, TreeConfig(root_branches=G, branch_factor=1, repeat_ngram=0))
    groups, _ = sampler.generate(engine_for(tiny), prompts[:2], [G, G], seed=5)
    for pi, g in enumerate(groups):
        assert [len(r.node_path) for r in g.rollouts] == [2] * G  # root → leaf, no inner nodes
        root_seed = hash((5, pi, 0)) & (2**62 - 1)
        alone = engine_for(tiny).generate(
            [Request(prompts[pi].token_ids, replace(params, seed=child_seed(root_seed, i))) for i in range(G)])
        got = sorted(r.completion_ids for r in g.rollouts)
        assert got == sorted(c.token_ids for c in alone)
        assert len({tuple(t) for t in got}) > 1  # they do differ


def test_tree_budget_without_fallback_never_exceeds(tiny, prompts):
    sampler = TreeSampler(params_for(tiny), decode, TreeConfig(segment_len=3, branch_factor=4, max_depth=5,
                                                                fallback=False, repeat_ngram=0))
    groups, _ = sampler.generate(engine_for(tiny), prompts, [5] * len(prompts), seed=2)
    assert all(1 <= len(g.rollouts) <= 5 for g in groups)
    for g in groups:
        check_tree_group(g)


def test_tree_entropy_rule_branches_only_at_high_entropy(tiny, prompts):
    fixed = TreeSampler(params_for(tiny), decode, TreeConfig(segment_len=4, fallback=False, repeat_ngram=0))
    picky = TreeSampler(params_for(tiny), decode, TreeConfig(segment_len=4, fallback=False, repeat_ngram=0,
                                                              branch_rule="entropy", entropy_quantile=1.0))
    _, fixed_metrics = fixed.generate(engine_for(tiny), prompts, [G] * len(prompts), seed=4)
    _, picky_metrics = picky.generate(engine_for(tiny), prompts, [G] * len(prompts), seed=4)
    # quantile 1: only a segment at least as uncertain as every segment seen before may fork
    assert picky_metrics["tree/forks"] < fixed_metrics["tree/forks"]
    assert len(picky.state_dict()["entropies"]) > 0
    restored = TreeSampler(params_for(tiny), decode, picky.cfg)
    restored.load_state_dict(picky.state_dict())
    assert list(restored.entropies) == list(picky.entropies)


def test_repeats():
    assert repeats([1, 2, 3, 1, 2, 3], 3)
    assert not repeats([1, 2, 3, 4, 5, 6], 3)
    assert repeats([7, 7, 7], 2)  # overlapping occurrence
    assert not repeats([1, 2], 2)


def test_tree_repeat_stops_a_looping_path(tiny, prompts):
    sampler = TreeSampler(params_for(tiny, max_new_tokens=60), decode,
                          TreeConfig(segment_len=2, repeat_ngram=1, branch_factor=1, root_branches=4))
    groups, _ = sampler.generate(engine_for(tiny), prompts, [4] * len(prompts), seed=0)
    pruned = [r for g in groups for r in g.rollouts if r.finish_reason == "pruned"]
    assert pruned  # with n=1, any repeated token at a boundary stops the path
    for r in pruned:
        assert r.completion_ids[-1] in r.completion_ids[:-1]


# -- latr (LATR) -----------------------------------------------------------------------------
def test_jaccard():
    assert jaccard([1, 2, 3, 4, 5], [1, 2, 3, 4, 5], 4) == 1.0
    assert jaccard([1, 2, 3, 4, 5], [9, 8, 7, 6, 5], 4) == 0.0
    # 4-grams {1234, 2345} vs {1234, 2349}: 1 shared of 3
    assert jaccard([1, 2, 3, 4, 5], [1, 2, 3, 4, 9], 4) == pytest.approx(1 / 3)


@pytest.mark.parametrize("similarity,ngram", [(1.0, 4), (0.0, 1)])
def test_latr_exact_group_size_forced_tokens_masked(tiny, prompts, similarity, ngram):
    sampler = LatrSampler(params_for(tiny), decode, LatrConfig(lookahead=6, prune_similarity=similarity,
                                                                branch_threshold=0.9, ngram=ngram))
    engine = engine_for(tiny)
    groups, m = sampler.generate(engine, prompts, [G] * len(prompts), seed=7)
    assert m["latr/branches"] > 0
    forced_seen = 0
    for g in groups:
        assert len(g.rollouts) == G  # always exactly G trajectories
        check_tree_group(g)
        nodes = g.tree.nodes
        for r in g.rollouts:
            for t, keep in enumerate(r.loss_weights or []):
                if keep:
                    continue
                # a forced token starts its node; a sibling that kept the sampled token differs there
                forced_seen += 1
                node = next(n for n in r.node_path[1:] if nodes[n].start == t)
                siblings = {c for c in nodes[nodes[node].parent].children if c != node and nodes[c].start == t}
                for other in g.rollouts:
                    if siblings & set(other.node_path):
                        assert other.completion_ids[:t] == r.completion_ids[:t]
                        assert other.completion_ids[t] != r.completion_ids[t]
    assert forced_seen > 0
    # tokens the engine sampled = tokens kept in trees + tokens of pruned branches − forced tokens
    kept = sum(g.tree.unique_tokens for g in groups)
    assert engine.stats.decode_tokens == kept + m["latr/wasted_tokens"] - m["latr/branches"]
    assert engine.stats.decode_tokens == m["latr/sampled_tokens_per_leaf"] * G * len(prompts)
    if similarity == 1.0:
        assert m["latr/pruned"] == 0  # Jaccard is never > 1
    else:
        assert m["latr/pruned"] > 0 and m["latr/wasted_tokens"] > 0


# -- april (APRIL) ---------------------------------------------------------------------------
class ScriptedEngine:
    """A fake engine whose request k (in submission order per prompt text) emits a scripted
    number of tokens, one per step; token value = position. Supports pause/resume."""

    def __init__(self, lengths: dict[int, int]):
        self.lengths = lengths  # first prompt token -> completion length
        self.version = 0
        self.running: dict[int, dict] = {}
        self.next = 0
        self.stats = type("S", (), {"decode_tokens": 0})()

    def _add(self, prompt, tokens, versions, params, seed):
        h = self.next
        self.next += 1
        self.running[h] = {"prompt": prompt, "tokens": tokens, "versions": versions, "params": params, "seed": seed}
        return h

    def submit(self, requests):
        return [self._add(list(r.prompt_ids), [], [], r.params, r.params.seed) for r in requests]

    def step(self):
        done = []
        for h, s in list(self.running.items()):
            s["tokens"].append(len(s["tokens"]))
            s["versions"].append(self.version)
            self.stats.decode_tokens += 1
            if len(s["tokens"]) >= self.lengths[s["prompt"][0]]:
                del self.running[h]
                n = len(s["tokens"])
                done.append(Completion(h, s["prompt"], s["tokens"], [0.0] * n, s["versions"], "stop"))
        return done

    def pause(self, handles, keep_cache=False):
        out = []
        for h in handles:
            s = self.running.pop(h)
            out.append(PartialState(s["prompt"], s["tokens"], [0.0] * len(s["tokens"]), s["versions"], s["params"],
                                    s["seed"], torch.zeros(1, dtype=torch.uint8)))
        return out

    def resume(self, states):
        return [self._add(st.prompt_ids, list(st.token_ids), list(st.versions), st.params, st.seed) for st in states]


def test_april_methods_case_short_groups_first_long_one_carried():
    """METHODS.md: lengths [10, 10, 10, 1000], B = 3, B' = 4."""
    engine = ScriptedEngine({0: 10, 1: 10, 2: 10, 3: 1000, 4: 10, 5: 10, 6: 10})
    sampler = AprilSampler(SamplingParams(max_new_tokens=2000), decode, AprilConfig(over_provision=4 / 3), target=3)
    prompts = [Prompt(id=str(i), text="", token_ids=[i]) for i in range(4)]
    assert sampler.prompts_wanted(3) == 4
    step1, _ = sampler.generate(engine, prompts, [2] * 4, seed=0)
    assert sorted(g.prompt.id for g in step1) == ["0", "1", "2"]
    assert len(sampler.buffer) == 1 and sampler.buffer[0].prompt.id == "3"
    assert [len(p.token_ids) for p in sampler.buffer[0].partial] == [10, 10]  # paused at the tenth token
    assert sampler.started == 8 and sampler.trained == 6 and sampler.carried == 2
    engine.version = 1
    assert sampler.prompts_wanted(3) == 3
    step2, _ = sampler.generate(engine, [Prompt(id=str(i), text="", token_ids=[i]) for i in (4, 5, 6)], [2] * 3, seed=1)
    assert sorted(g.prompt.id for g in step2) == ["4", "5", "6"]  # the long group is still running
    engine.version = 2
    total_steps = 2
    while sampler.buffer:
        total_steps += 1
        engine.version += 1
        fresh = [Prompt(id=f"f{total_steps}", text="", token_ids=[4])]
        out, _ = sampler.generate(engine, fresh, [2], seed=total_steps)
        long = [g for g in out if g.prompt.id == "3"]
        if long:
            (g,) = long
            for r in g.rollouts:
                assert r.completion_ids == list(range(1000))  # continued, never restarted
                assert all(a <= b for a, b in zip(r.versions, r.versions[1:]))  # versions never decrease
                assert r.versions[0] == 0 and r.versions[-1] > 0
    assert sampler.started == sampler.trained + sampler.carried


def test_april_with_fixed_weights_equals_the_uninterrupted_run(tiny, prompts):
    """Deterministic policy (weights unchanged): every carried rollout ends as it would have unpaused."""
    params = params_for(tiny, max_new_tokens=96)
    engine = engine_for(tiny, slots=64)
    sampler = AprilSampler(params, decode, AprilConfig(over_provision=2), target=2)
    seen = {}
    fresh_by_step, resumed_counts = [], []
    cursor = 0
    for step in range(6):
        n = sampler.prompts_wanted(2)
        fresh = [prompts[(cursor + i) % len(prompts)] for i in range(n)]
        fresh = [replace(p, id=f"{p.id}@{step}.{i}") for i, p in enumerate(fresh)]
        cursor += n
        fresh_by_step.append((step, fresh))
        groups, metrics = sampler.generate(engine, fresh, [2] * len(fresh), seed=step)
        for g in groups:
            seen[g.prompt.id] = g
        resumed_counts.append(metrics["april/resumed_tokens"])
        assert sampler.started == sampler.trained + sampler.carried  # nothing lost, every step
    assert any(m > 0 for m in resumed_counts)  # some rollouts really were paused and resumed
    # recompute every returned group without interruption, with the same per-request seeds
    for step, fresh in fresh_by_step:
        for pi, p in enumerate(fresh):
            if p.id not in seen:
                continue
            reqs = [Request(p.token_ids, replace(params, seed=hash((step, pi, j)) & (2**62 - 1))) for j in range(2)]
            alone = engine_for(tiny).generate(reqs)
            assert sorted(r.completion_ids for r in seen[p.id].rollouts) == sorted(c.token_ids for c in alone)
    assert sampler.trained > 0


# -- in the trainer --------------------------------------------------------------------------
FAST = ["task.eval_size=4", "rollout.prompts_per_step=4", "rollout.num_generations=4", "rollout.max_new_tokens=24",
        "train.eval_samples=0", "optim.micro_batch_size=16", "model.threads=1", "sft.steps=3"]
STRATEGY_OPTS = {
    "group": [],
    "tree": ["rollout.tree.segment_len=4"],
    "latr": ["rollout.latr.lookahead=4"],
    "april": ["objective.tis_mode=token_truncate"],
}


@pytest.mark.parametrize("task", ["arith", "countdown"])
@pytest.mark.parametrize("strategy", list(STRATEGY_OPTS))
def test_each_strategy_trains_on_each_task(tmp_path, strategy, task):
    cfg = load_run_config(None, [f"output_dir={tmp_path}", f"task.name={task}", f"rollout.strategy={strategy}",
                                 *FAST, *STRATEGY_OPTS[strategy]])
    trainer = Trainer(cfg)
    trainer.prepare()
    for _ in range(2):
        m = trainer.step()
        assert all(v == v for v in m.values())  # no NaN
        assert m["tokens/generated"] > 0
    if strategy in ("tree", "latr"):
        assert m[f"{strategy}/leaves_per_prompt"] == 4
    if strategy == "april":
        assert m["april/started"] == m["april/trained"] + m["april/carried_rollouts"]


def test_tree_strategy_needs_the_slot_engine(tmp_path):
    cfg = load_run_config(None, [f"output_dir={tmp_path}", "rollout.strategy=tree", "rollout.engine=v1", *FAST])
    trainer = Trainer(cfg)
    trainer.prepare()
    with pytest.raises(ValueError, match="slot engine"):
        trainer.step()


def _capture(trainer):
    """Record the groups each step trains on."""
    seen = []
    generate = trainer.generator.generate

    def wrapped(*a, **kw):
        groups, metrics = generate(*a, **kw)
        seen.append(groups)
        return groups, metrics

    trainer.generator.generate = wrapped
    return seen


@pytest.mark.parametrize("strategy", ["april", "tree"])
def test_strategy_state_survives_checkpoint_and_resume(tmp_path, strategy):
    """APRIL's carry-over buffer (and TreePO's entropy window) are checkpointed: a resumed run
    trains on the same rollouts, with the same per-token versions, as the uninterrupted one."""
    # april: groups of one, so the first half to finish is returned and the rest is carried
    opts = [f"rollout.max_new_tokens={96 if strategy == 'april' else 40}", "rollout.april.over_provision=2", "objective.tis_mode=token_truncate",
            "rollout.tree.branch_rule=entropy", "rollout.tree.segment_len=4",
            f"rollout.num_generations={1 if strategy == 'april' else 4}"]
    full = Trainer(load_run_config(None, [f"output_dir={tmp_path}", "name=full", f"rollout.strategy={strategy}",
                                          *FAST, *opts]))
    full.prepare()
    seen_full = _capture(full)
    metrics_full = [full.step() for _ in range(5)]

    cfg = load_run_config(None, [f"output_dir={tmp_path}", "name=cut", f"rollout.strategy={strategy}", *FAST, *opts])
    first = Trainer(cfg)
    first.prepare()
    for _ in range(2):
        first.step()
    first.checkpoint()
    first.step()  # lost
    del first
    resumed = Trainer(cfg)
    resumed.prepare(resume=True)
    assert resumed.engine.version == 2
    seen_resumed = _capture(resumed)
    metrics_resumed = [resumed.step() for _ in range(3)]
    for a, b in zip(seen_full[2:], seen_resumed):
        assert [[r.completion_ids for r in g.rollouts] for g in a] == [[r.completion_ids for r in g.rollouts] for g in b]
        assert [[r.versions for r in g.rollouts] for g in a] == [[r.versions for r in g.rollouts] for g in b]
    for k in ("loss", "reward/mean", "tokens/total"):
        assert [m[k] for m in metrics_full[2:]] == [m[k] for m in metrics_resumed], k
    if strategy == "april":
        versions = {v for groups in seen_resumed for g in groups for r in g.rollouts for v in r.versions}
        assert min(versions) < 2  # carried tokens kept the versions that sampled them
        last = metrics_resumed[-1]
        assert last["april/started"] == last["april/trained"] + last["april/carried_rollouts"]


def test_pause_keep_cache_resumes_without_recomputing(tiny, prompts):
    """keep_cache: the resumed sequence copies its parked cache back (no prefill) and, under the
    same weights, continues exactly as the uninterrupted run (tokens; log-probs to float noise)."""
    params = params_for(tiny, max_new_tokens=30, temperature=1.0)
    reqs = [Request(p.token_ids, replace(params, seed=11 + i)) for i, p in enumerate(prompts)]
    straight = engine_for(tiny).generate(reqs)
    engine = engine_for(tiny)
    handles = engine.submit(reqs)
    for _ in range(6):
        engine.step()
    running = [h for h in handles if h in engine._live]
    states = engine.pause(running, keep_cache=True)
    assert all(st.kv is not None and st.kv_version == 0 for st in states)
    prefilled = engine.stats.prefill_tokens
    new = engine.resume(states)
    done = engine.run_until()
    assert engine.stats.prefill_tokens == prefilled and engine.stats.reprefill_tokens == 0
    assert engine.stats.restored_tokens == sum(len(st.prompt_ids) + len(st.token_ids) - 1 for st in states)
    for st, h in zip(states, new):
        want = next(c for c, r in zip(straight, reqs) if r.prompt_ids == st.prompt_ids)
        got = done[h]
        assert got.token_ids == want.token_ids
        assert torch.allclose(torch.tensor(got.logprobs), torch.tensor(want.logprobs), atol=1e-4)


def test_april_reuse_kv_carries_caches_but_checkpoints_drop_them(tiny, prompts):
    params = params_for(tiny, max_new_tokens=96)
    engine = engine_for(tiny, slots=64)
    sampler = AprilSampler(params, decode, AprilConfig(over_provision=2, reuse_kv=True), target=2)
    cursor = 0
    for step in range(5):
        n = sampler.prompts_wanted(2)
        fresh = [replace(prompts[(cursor + i) % len(prompts)], id=f"{step}.{i}") for i in range(n)]
        cursor += n
        sampler.generate(engine, fresh, [2] * n, seed=step)
        assert sampler.started == sampler.trained + sampler.carried
    assert engine.stats.restored_tokens > 0 and engine.stats.reprefill_tokens == 0
    carried = [p for f in sampler.buffer for p in f.partial]
    assert carried and any(p.kv is not None for p in carried)
    state = sampler.state_dict()
    assert all(p.kv is None for p in carried)  # dropped in the live buffer too: both runs now recompute
    restored = AprilSampler(params, decode, sampler.cfg, target=2)
    restored.load_state_dict(state)
    assert [[p.token_ids for p in f.partial] for f in restored.buffer] == [[p.token_ids for p in f.partial]
                                                                           for f in sampler.buffer]
