"""``rollout.workers`` (dist/): rollout workers as Ray actors, on a local Ray cluster.

- a shard of a step (the prompts list with budget 0 for the others) samples exactly what the
  whole step samples for those prompts, for every strategy (no Ray needed);
- 2 workers train 3 steps and produce the same completions as the in-process run (sync, same
  seed), parameters move, every prompt comes back;
- a worker killed mid-step: its prompts are re-issued, the step completes with the same
  completions, the worker is replaced;
- async with workers equals async in-process; a run cut short and resumed with workers leaves
  the files of the uninterrupted run; a SIGKILLed driver resumes; episodes on workers equal the
  in-process run; scoring on the driver gives the workers' rewards; without restarts a run goes
  on with fewer workers (these slow: make test-all — each part is in the default suite alone);
- bad combinations are ConfigErrors.
"""

from __future__ import annotations

import os

import pytest
import torch
from runfiles import assert_same_run, crash_and_resume, kill_and_resume

from rollwise.config import ConfigError
from rollwise.dist import balance, merge_metrics
from rollwise.engine.sampling import SamplingParams
from rollwise.engine.slots import SlotEngine
from rollwise.generate import build_generator
from rollwise.train.config import RolloutConfig, load_run_config
from rollwise.train.loop import Trainer
from rollwise.types import Prompt

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install 'rollwise[ray]'")


@pytest.fixture(scope="module")
def cluster(ray_cluster):
    return ray_cluster


def sets(tmp_path, warm, name, *extra):
    return [f"output_dir={tmp_path}", f"name={name}", f"model.path={warm}", "task.max_digits=1", "task.eval_size=8",
            "model.threads=1", "train.eval_samples=2", "rollout.prompts_per_step=4", "rollout.num_generations=4",
            "rollout.max_new_tokens=24", "optim.micro_batch_size=8", "optim.lr=1e-3", "train.steps=3", *extra]


def run(tmp_path, warm, name, *extra, before_step=None, behaviour=None):
    """Fit a run; return (the completions of every trained batch, per-step metrics, final weights,
    whether they moved); ``behaviour`` (a list) receives every trained rollout's behaviour log-probs."""
    batches, steps = [], []
    with Trainer(load_run_config(None, sets(tmp_path, warm, name, *extra))) as t:
        t.prepare()
        start = {k: v.clone() for k, v in t.model.state_dict().items()}
        train_on = t.train_on

        def spy(batch, waited=0.0):
            batches.append([(g.prompt.id, [r.completion_ids for r in g.rollouts]) for g in batch.groups])
            if behaviour is not None:
                behaviour.extend(lp for g in batch.groups for r in g.rollouts for lp in r.behavior_logprobs)
            return train_on(batch, waited)

        t.train_on = spy
        if before_step is not None:
            step = t.step

            def hooked():
                before_step(t)
                return step()

            t.step = hooked
        t.fit(on_step=lambda s, m: steps.append(dict(m)))
        weights = {k: v.clone() for k, v in t.model.state_dict().items()}
    moved = any(not torch.equal(start[k], weights[k]) for k in start)
    return batches, steps, weights, moved


@pytest.fixture(scope="module")
def in_process(tmp_path_factory, warm):
    return run(tmp_path_factory.mktemp("local"), warm, "local")


# -- no Ray: the shard invariant the workers rest on ------------------------------------------------


@pytest.mark.parametrize("strategy", ["group", "tree", "latr"])
def test_a_shard_samples_what_the_whole_step_samples(tiny, strategy):
    model, tok = tiny
    prompts = [Prompt(str(i), t, token_ids=tok(t)["input_ids"]) for i, t in enumerate(["1+2=", "3+4=", "5+6=", "7+8="])]
    budgets = [4, 4, 4, 4]
    rollout = RolloutConfig(strategy=strategy, max_new_tokens=16)
    params = SamplingParams(max_new_tokens=16, stop_token_ids=(tok.eos_token_id,))

    def sample(budgets):
        engine = SlotEngine(model, pad_token_id=tok.pad_token_id, seed=0)
        gen = build_generator(rollout, params, lambda ids: tok.decode(ids))
        groups, _ = gen.generate(engine, prompts, budgets, seed=11)
        return [[r.completion_ids for r in g.rollouts] for g in groups]

    whole = sample(budgets)
    left, right = sample([4, 0, 4, 0]), sample([0, 4, 0, 4])
    assert left[1] == left[3] == right[0] == right[2] == []  # budget 0: an empty group, nothing sampled
    assert [left[0], right[1], left[2], right[3]] == whole
    assert all(len(g) == 4 for g in whole)


def test_weights_travel_as_numpy_and_come_back_bit_equal():
    from rollwise.dist.pool import from_numpy, to_numpy

    state = {"w": torch.randn(3, 4), "b": torch.randn(5).to(torch.bfloat16), "i": torch.arange(4)}
    back = from_numpy(to_numpy(state))
    assert all(back[k].dtype == state[k].dtype and torch.equal(back[k], state[k]) for k in state)


def test_balance_and_merge():
    assert balance([8, 8, 8, 8], 2) == [[0, 2], [1, 3]]
    assert balance([12, 4, 4, 4], 2) == [[0], [1, 2, 3]]  # by rollouts, not prompts
    assert balance([4, 0, 4], 3) == [[0], [2], []]
    merged = merge_metrics([(1, {"tree/forks": 2.0, "tree/leaves_per_prompt": 4.0, "reward/x/errors": 1.0}),
                            (3, {"tree/forks": 1.0, "tree/leaves_per_prompt": 8.0})])
    assert merged == {"tree/forks": 3.0, "tree/leaves_per_prompt": 7.0, "reward/x/errors": 1.0}


# -- on a local Ray cluster -----------------------------------------------------------------------


def test_two_workers_train_like_the_in_process_run(tmp_path, warm, cluster, in_process):
    local, local_steps, local_weights, _ = in_process
    batches, steps, weights, moved = run(tmp_path, warm, "dist", "rollout.workers=2")
    assert len(batches) == 3 and moved
    assert batches == local  # same prompts, same completions, step after step
    assert all(torch.equal(weights[k], local_weights[k]) for k in weights)
    for m in steps:
        assert m["dist/workers"] == 2 and m["dist/prompts_sent"] == m["dist/prompts_returned"] == 4
        assert m["dist/lost_workers"] == m["dist/reissued_prompts"] == 0
        assert m["time/weight_sync"] > 0  # every step loads the new version
        assert m["rollouts/trained"] == 16
    for a, b in zip(steps, local_steps):  # scored on the workers: the same rewards and reward metrics
        assert a["reward/arith"] == b["reward/arith"] and a["reward/arith/errors"] == b["reward/arith/errors"] == 0
        assert a["loss"] == b["loss"] and a["tokens/generated"] == b["tokens/generated"]


@pytest.mark.slow  # ~10 s of Ray (beside the other test worker): the scoring path only; two_workers covers workers
def test_scoring_on_the_driver_gives_the_same_rewards(tmp_path, warm, cluster, in_process):
    _, local_steps, _, _ = in_process
    _, steps, _, _ = run(tmp_path, warm, "driver", "rollout.workers=2", "rollout.score_on=driver")
    assert len(steps) == len(local_steps) == 3
    for a, b in zip(steps, local_steps):
        assert a["reward/mean"] == b["reward/mean"] and a["reward/arith"] == b["reward/arith"]


def test_code_rewards_run_in_the_workers_sandboxes(tmp_path, cluster):
    """The code task's reward runs model-written code in each worker's own sandbox: the same scores
    and reasons as in-process, computed on the workers."""
    def scored(name, *extra):
        cfg = load_run_config(None, [
            f"output_dir={tmp_path}", f"name={name}", "task.name=code", "task.eval_size=4", "sft.steps=5",
            "train.steps=1", "train.eval_samples=0", "rollout.prompts_per_step=4", "rollout.num_generations=4",
            "rollout.max_new_tokens=12", "model.threads=1", "train.checkpoint_every=0", *extra])
        out, steps = [], []
        with Trainer(cfg) as t:
            t.prepare()
            train_on = t.train_on

            def spy(batch, waited=0.0):
                out.extend((r.completion_text, r.reward_components, r.reward_reasons)
                           for g in batch.groups for r in g.rollouts)
                return train_on(batch, waited)

            t.train_on = spy
            t.fit(on_step=lambda s, m: steps.append(m))
        return out, steps

    local, _ = scored("code_local")
    remote, steps = scored("code_dist", "rollout.workers=2")
    assert remote == local and len(local) == 16
    assert any(reasons for _, _, reasons in remote)  # the sandbox ran and said why code failed
    assert steps[0]["time/worker_score"] > 0 and steps[0]["reward/code_fn/errors"] == 0


def test_a_killed_worker_loses_no_prompt(tmp_path, warm, cluster, in_process):
    local, _, _, _ = in_process
    killed = []

    def kill_first_worker_at_step_1(t):
        pool = t.pool

        def kill(pool):
            if t.state.step == 1 and not killed:
                killed.append(pool.workers[0])
                ray.kill(pool.workers[0])  # while its shard is queued or running

        pool.after_dispatch = kill

    batches, steps, _, _ = run(tmp_path, warm, "kill", "rollout.workers=2", before_step=kill_first_worker_at_step_1)
    assert len(killed) == 1
    assert steps[1]["dist/lost_workers"] == 1 and steps[1]["dist/restarts"] == 1
    assert steps[1]["dist/reissued_prompts"] == 2  # worker 0's shard: prompts 0 and 2
    assert steps[1]["dist/prompts_returned"] == 4 and steps[1]["rollouts/trained"] == 16
    assert batches == local  # the re-issued prompts sampled what worker 0 would have
    assert steps[2]["dist/workers"] == 2 and steps[2]["dist/lost_workers"] == 0  # the replacement works


@pytest.mark.slow  # ~10 s of Ray (beside the other test worker): killed_worker covers a lost worker
def test_without_restarts_the_run_goes_on_with_fewer_workers(tmp_path, warm, cluster, in_process):
    local, _, _, _ = in_process

    def kill(t):
        if t.state.step == 0:
            t.pool.after_dispatch = lambda pool: (ray.kill(pool.workers[1]), setattr(pool, "after_dispatch", None))

    batches, steps, _, _ = run(tmp_path, warm, "norestart", "rollout.workers=2", "rollout.worker_restarts=0",
                               before_step=kill)
    assert [m["dist/workers"] for m in steps] == [1, 1, 1] and steps[0]["dist/reissued_prompts"] == 2
    assert batches == local


def test_losing_the_last_worker_is_a_clear_error(tmp_path, warm, cluster):
    def kill(t):
        t.pool.after_dispatch = lambda pool: ray.kill(pool.workers[0])

    with pytest.raises(RuntimeError, match="every rollout worker died"):
        run(tmp_path, warm, "last", "rollout.workers=1", "rollout.worker_restarts=0", before_step=kill)


@pytest.mark.slow  # ~10 s of Ray (beside the other test worker): async and workers each tested apart
def test_async_with_workers_equals_async_in_process(tmp_path, warm, cluster):
    """What async with workers guarantees, on every CPU: the same sampled ids step after step,
    behaviour log-probs equal up to float rounding, and final weights equal up to what that
    rounding moves them.

    Not bit-equal weights: async trains with the truncated importance weight exp(ℓ_old − ℓ_μ) on
    the behaviour log-probs ℓ_μ the sampler recorded, and a worker's shard (8 rows) runs its forward
    over fewer rows than the in-process producer's whole step (16). A row's float result may depend
    on how many rows share a GEMM: on AVX-512 CPUs it does (kernels are chosen by shape; seen as
    last-bit differences in ℓ_μ), on AVX2 it happens not to. Sampled ids are robust to it (Gumbel-max
    over the same logits up to rounding). The bound: perturbing every ℓ_μ by 1e-6 relative moves the
    weights of this run by 8e-5 of their update (measured on an AVX2 CPU, 2026-11-26); training on a
    different batch moves them by the order of the update itself. The sync test asserts bit-equal
    weights: its default correction (``sequence_mask``) is a 0/1 band, insensitive to ℓ_μ's last bits.
    """
    common = ("train.mode=async", "train.generation_threads=1", "train.max_staleness=1")
    local_mu, mu = [], []
    local, _, local_weights, _ = run(tmp_path, warm, "async_local", *common, behaviour=local_mu)
    batches, steps, weights, _ = run(tmp_path, warm, "async_dist", *common, "rollout.workers=2", behaviour=mu)
    assert batches == local
    assert [m["staleness/max"] for m in steps] == [0, 1, 1]
    assert len(mu) == len(local_mu) > 0
    assert max(abs(a - b) for a, b in zip(mu, local_mu)) <= 1e-4
    from transformers import AutoModelForCausalLM

    initial = AutoModelForCausalLM.from_pretrained(warm).state_dict()
    update = torch.sqrt(sum(((local_weights[k] - initial[k]) ** 2).sum() for k in local_weights))
    gap = torch.sqrt(sum(((weights[k] - local_weights[k]) ** 2).sum() for k in local_weights))
    assert update > 0 and gap <= 1e-3 * update, f"weights differ by {float(gap / update):.2e} of the update"


@pytest.mark.slow  # ~33 s; the SIGKILLed driver with workers is slow too
def test_resume_with_workers_leaves_the_files_of_the_uninterrupted_run(tmp_path, warm, cluster):
    common = ["train.steps=4", "train.checkpoint_every=2", "train.eval_every=2", "rollout.workers=2",
              "rollout.strategy=tree", "rollout.tree.branch_rule=entropy"]

    def check(resumed):
        assert resumed.state.step == 2 and len(resumed.pool.workers) == 2

    crash_and_resume(lambda name: load_run_config(None, sets(tmp_path, warm, name, *common)), 3, on_resume=check)
    files = assert_same_run(tmp_path / "full", tmp_path / "cut")
    state = torch.load(tmp_path / "cut" / "checkpoints" / "step_000004" / "generator.pt", weights_only=False)
    assert len(state["workers"]) == 2 and all(s["entropies"] for s in state["workers"])  # each worker's window
    assert "checkpoints/step_000004/generator.pt" in files


@pytest.mark.slow
def test_a_sigkilled_driver_with_workers_resumes_like_the_uninterrupted_run(tmp_path, warm, cluster):
    """SIGKILL a real `rollwise train --set rollout.workers=2` driver (joined to this cluster through
    RAY_ADDRESS; its actors die with it), then --resume it: the files of the run never killed."""
    common = ["train.steps=6", "train.checkpoint_every=2", "train.eval_every=3", "rollout.workers=2"]
    run_sets = [s for s in sets(tmp_path, warm, "x", *common) if not s.startswith(("output_dir=", "name="))]
    os.environ["RAY_ADDRESS"] = cluster
    try:
        assert_same_run(*kill_and_resume(tmp_path, run_sets, "step_000002"))
    finally:
        os.environ.pop("RAY_ADDRESS", None)


def test_the_local_cluster_listens_on_loopback_only(cluster):
    """The test cluster (conftest) and ``connect()``'s local cluster bind to 127.0.0.1: Ray's
    default on Linux is the machine's network address."""
    assert cluster.startswith("127.0.0.1:")
    assert {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]} == {"127.0.0.1"}


def test_connect_starts_a_loopback_cluster(tmp_path):
    """``rollout.workers`` without ``RAY_ADDRESS`` starts a cluster bound to 127.0.0.1 (a fresh process:
    the switch must hold for a ``ray`` not yet imported)."""
    import subprocess
    import sys
    import tempfile

    ray_tmp = tempfile.mkdtemp(prefix="rw-ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 characters
    code = ("from rollwise.dist import connect; r = connect(); "
            "print(r.get_runtime_context().gcs_address, r.nodes()[0]['NodeManagerAddress']); r.shutdown()")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")}
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                             env=env | {"RAY_TMPDIR": ray_tmp, "RAY_AUTH_MODE": "disabled"}, cwd=tmp_path)
    finally:
        import shutil

        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert out.returncode == 0, out.stderr[-2000:]
    gcs, node = out.stdout.split()[-2:]
    assert gcs.startswith("127.0.0.1:") and node == "127.0.0.1"


def test_without_ray_installed_workers_are_a_config_error(monkeypatch):
    import sys

    from rollwise.dist import connect

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'rollwise\[ray\]'"):
        connect()


@pytest.mark.parametrize("extra, match", [
    (["rollout.strategy=april"], "april"),
    (["control.method=arrol"], "arrol"),
])
def test_combinations_workers_cannot_run_are_config_errors(tmp_path, warm, extra, match):
    with pytest.raises(ConfigError, match=match):
        Trainer(load_run_config(None, sets(tmp_path, warm, "bad", "rollout.workers=2", *extra)))


@pytest.mark.slow  # ~10 s of Ray (beside the other test worker): episodes and workers each tested apart
def test_episodes_on_two_workers_equal_the_in_process_run(tmp_path, warm, cluster):
    """``rollout.environment`` with workers: each worker runs the episodes of its prompts with its own
    environments; the trained batches and weights equal the in-process run's."""
    env = ["rollout.environment=calculator", "rollout.max_turns=2"]
    local, _, local_weights, _ = run(tmp_path / "local", warm, "episodes-local", *env)
    batches, steps, weights, moved = run(tmp_path / "dist", warm, "episodes-dist", "rollout.workers=2", *env)
    assert moved and batches == local
    assert all(torch.equal(weights[k], local_weights[k]) for k in weights)
    assert all("episode/tool_calls" in m for m in steps)
