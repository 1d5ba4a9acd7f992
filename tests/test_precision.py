"""Sampling precision apart from training precision (issue 34, items 2–3).

The engine keeps its own low-precision copy of the weights (``rollout.engine_dtype``), refreshed
at every ``load_weights``; the mismatch between behaviour and trainer log-probs is measured every
step (``mismatch/*``), corrected, and guarded. Nothing here asserts a speed or a bit-equal bf16
number: bf16 and fp32 are compared only where the logits' top-2 gap guarantees the same token.
"""

import copy
from pathlib import Path

import pytest
import torch

from rollwise.engine import make_engine
from rollwise.engine.engine import Engine, Request
from rollwise.engine.sampling import SamplingParams
from rollwise.engine.slots import SlotEngine

SAMPLES = Path(__file__).parent / "fixtures" / "cpuinfo"
PROMPTS = [[1, 5, 9, 13], [2, 7], [3, 4, 11, 6, 8], [9, 9, 2]]


def engines(model, dtype):
    return [SlotEngine(model, pad_token_id=0, max_batch_size=8, seed=0, dtype=dtype),
            Engine(model, pad_token_id=0, max_batch_size=8, seed=0, dtype=dtype)]


def first_tokens(engine, temperature=0.0, n=1, seed=0):
    params = SamplingParams(temperature=temperature, max_new_tokens=n, seed=seed)
    return [c.token_ids for c in engine.generate([Request(p, params) for p in PROMPTS])]


@pytest.fixture
def model(tiny):
    return copy.deepcopy(tiny[0])


# -- the engine's own copy ----------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["slots", "v1"])
def test_the_low_precision_copy_follows_an_update(model, kind):
    """A changed weight reaches a bf16 engine's sampler at load_weights, and not before: the
    engine samples from its own copy; the trainer's fp32 masters are never written."""
    engine = engines(model, torch.bfloat16)[0 if kind == "slots" else 1]
    assert engine.dtype == torch.bfloat16 and model.dtype == torch.float32
    before = first_tokens(engine)
    with torch.no_grad():
        model.model.norm.weight.neg_()  # the update: every logit negated, so every argmax moves
    assert first_tokens(engine) == before  # the copy has not seen it yet
    engine.load_weights(model)
    after = first_tokens(engine)
    assert all(a != b for a, b in zip(after, before))
    assert model.dtype == torch.float32 and all(p.dtype == torch.float32 for p in model.parameters())


def test_an_fp32_engine_reads_the_model_by_reference(model):
    engine = SlotEngine(model, pad_token_id=0, max_batch_size=8, seed=0, dtype=torch.float32)
    assert engine.forward.embed is model.model.embed_tokens.weight  # no copy: nothing changes
    engine = make_engine(model, pad_token_id=0, max_batch_size=8, seed=0, kind="v1")
    assert engine.model is model and engine.dtype == torch.float32


def test_set_dtype_recasts_between_generations(model):
    for engine in engines(model, torch.bfloat16):
        bf16 = first_tokens(engine, temperature=1.0, n=4)
        engine.set_dtype(torch.float32)
        assert engine.dtype == torch.float32
        fp32 = first_tokens(engine, temperature=1.0, n=4)
        reference = engines(model, None)[0 if isinstance(engine, SlotEngine) else 1]
        assert fp32 == first_tokens(reference, temperature=1.0, n=4)
        assert len(bf16) == len(fp32)


def sharp(model, scale):
    """The tiny model with its LM head scaled: every position's top-2 logit gap grows with ``scale``."""
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)  # tied: the embeddings too, the same model otherwise
    return model


def teacher_forced_gaps(model, prompt, completion):
    """fp32 top-2 logit gap at each completion position (the logits that chose token t)."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : len(prompt) + len(completion) - 1].float()
    top = logits.topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]).tolist()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_bf16_and_fp32_sample_the_same_ids_where_the_gap_guarantees_it(model, temperature):
    """Up to the first position where fp32's top-2 gap is small, bf16 and fp32 engines pick the
    same ids (greedy; and sampled on a fixed seed from a sharp model, where the top token holds
    all but e^-gap of the mass). Past it the two may part: nothing is asserted there."""
    model = sharp(model, 40.0)
    gap_needed = 4.0 if temperature == 0 else 30.0
    fp32 = first_tokens(engines(model, None)[0], temperature=temperature, n=12, seed=3)
    bf16 = first_tokens(engines(model, torch.bfloat16)[0], temperature=temperature, n=12, seed=3)
    compared = 0
    for prompt, a, b in zip(PROMPTS, fp32, bf16):
        gaps = teacher_forced_gaps(model, prompt, a)
        sure = next((i for i, g in enumerate(gaps) if g < gap_needed), len(gaps))
        assert a[:sure] == b[:sure]
        compared += sure
    assert compared >= 8  # the check compared something


# -- the mismatch metrics ---------------------------------------------------------------------
def test_mismatch_metrics_on_a_hand_case():
    """Trainer p = (1/2, 1/4) on two sampled tokens the behaviour gave (1/4, 1/4); a third token is
    off the mask and counts nowhere. r = π_trainer/π_behaviour = (2, 1):
    mean |Δlog p| = (log 2 + 0)/2; k3 = mean(r − 1 − log r) = (1 − log 2)/2, an estimate of
    KL(behaviour ‖ trainer) from the behaviour's samples; ESS = (Σr)²/(n Σr²) = 9/10."""
    import math

    from rollwise.optim.correction import behavior_weights, mismatch_metrics

    trainer = torch.tensor([[math.log(0.5), math.log(0.25), 0.0]])
    behaviour = torch.tensor([[math.log(0.25), math.log(0.25), -5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    m = {k: float(v) for k, v in mismatch_metrics(trainer, behaviour, mask).items()}
    assert m["mismatch/abs_logprob_diff"] == pytest.approx(math.log(2) / 2)
    assert m["mismatch/kl_k3"] == pytest.approx((1 - math.log(2)) / 2)
    assert m["mismatch/ess"] == pytest.approx(0.9)
    # the share the correction truncates or masks: per token (token modes), the tokens of a cut sequence
    frac = lambda mode, cap, cap_min=0.0: float(  # noqa: E731
        behavior_weights(trainer, behaviour, mask, mode, cap, cap_min)[1]["mismatch/truncated_frac"])
    assert frac("token_truncate", 1.5) == 0.5 and frac("token_mask", 1.5) == 0.5
    assert frac("token_truncate", 2.5) == 0.0
    assert frac("sequence_mask", 3.0) == 0.0 and frac("sequence_mask", 3.0, cap_min=2.5) == 1.0
    assert frac("sequence_truncate", 1.5) == 1.0
    same = mismatch_metrics(trainer, trainer, mask)  # no gap: no divergence, full sample size
    assert float(same["mismatch/kl_k3"]) == 0.0 and float(same["mismatch/ess"]) == pytest.approx(1.0)


# -- what auto picks ----------------------------------------------------------------------------
def test_auto_picks_bf16_only_with_native_bf16_and_a_faster_benchmark(model):
    from rollwise.hardware import cpu_info
    from rollwise.train.precision import choose

    genoa, avx2 = cpu_info(SAMPLES / "avx512_bf16_genoa.txt"), cpu_info(SAMPLES / "avx2_epyc.txt")
    asked = []
    faster = lambda shapes: asked.append(shapes) or 2.0  # noqa: E731  (the benchmark, stubbed)
    assert choose("auto", model, genoa, faster)[0] == torch.bfloat16
    assert asked[0].hidden == model.config.hidden_size and asked[0].vocab == model.config.vocab_size
    assert choose("auto", model, genoa, lambda shapes: 1.0)[0] == torch.float32  # native, but not faster
    assert choose("auto", model, avx2, faster)[0] == torch.float32  # AVX2-only: fp32, not even measured
    assert len(asked) == 1
    assert choose("auto", model, cpu_info(SAMPLES / "amx_sapphire_rapids.txt"), faster)[0] == torch.bfloat16
    assert choose("auto", model, cpu_info(SAMPLES / "avx512_cascade_lake.txt"), faster)[0] == torch.float32
    assert choose("bfloat16", model, avx2)[0] == torch.bfloat16  # asked for: runs (slowly) anywhere
    assert choose("float32", model, genoa, faster)[0] == torch.float32


def trainer_for(tmp_path, *sets):
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    cfg = load_run_config(None, [f"output_dir={tmp_path}", "task.max_digits=1", "task.eval_size=4",
                                 "rollout.prompts_per_step=2", "rollout.num_generations=4",
                                 "rollout.max_new_tokens=8", "train.eval_every=0", "train.checkpoint_every=0",
                                 "model.threads=1", "optim.skip_zero_advantage=false", *sets])
    return Trainer(cfg)


@pytest.fixture
def native_bf16_cpu(monkeypatch):
    """Detection forced to an AVX-512 BF16 CPU whose benchmark (stubbed) finds bf16 faster."""
    import rollwise.hardware

    monkeypatch.setenv("ROLLWISE_CPUINFO", str(SAMPLES / "avx512_bf16_genoa.txt"))
    monkeypatch.setattr(rollwise.hardware, "bf16_speedup", lambda shapes, info=None: 2.0)


def test_auto_on_this_avx2_sample_changes_nothing(tmp_path):
    with trainer_for(tmp_path) as t:  # conftest pins the AVX2 sample
        assert t.engine_dtype == torch.float32 and t.engine.dtype == torch.float32
        assert t.engine.forward.embed is t.model.model.embed_tokens.weight  # no copy
        assert t.cfg.objective.tis_mode == "sequence_mask"  # the sync default, unchanged
        assert t.summary()["engine_dtype"] == "float32" and t.summary()["cpu"]["model"] == "AMD EPYC"


def test_auto_on_a_native_bf16_cpu_samples_bf16_with_the_correction(tmp_path, native_bf16_cpu):
    with trainer_for(tmp_path) as t:
        assert t.engine.dtype == torch.bfloat16 and t.model.dtype == torch.float32
        assert t.cfg.objective.tis_mode == "token_truncate"
    with trainer_for(tmp_path, "objective.tis_mode=sequence_mask") as t:  # the recipe's choice wins
        assert t.cfg.objective.tis_mode == "sequence_mask"
    with trainer_for(tmp_path, "rollout.engine_dtype=float32") as t:
        assert t.engine.dtype == torch.float32 and t.cfg.objective.tis_mode == "sequence_mask"


# -- the guard ----------------------------------------------------------------------------------
def perturb(engine):
    """The engine's own copy of the LM head scaled: its behaviour policy is far from the trainer's."""
    w, b = engine.forward.lm_head
    engine.forward.lm_head = (w * 6, b)


def test_the_guard_falls_back_to_fp32_under_auto(tmp_path, native_bf16_cpu, caplog):
    with trainer_for(tmp_path, "name=auto", "train.steps=2") as t:
        t.prepare()
        perturb(t.engine)
        with caplog.at_level("WARNING", logger="rollwise.train.precision"):
            summary = t.fit()
        lines = [r for r in (tmp_path / "auto" / "metrics.jsonl").read_text().splitlines() if "mismatch/kl_k3" in r]
        import json

        first = json.loads(lines[0])
        assert first["mismatch/kl_k3"] > 0.01 and first["mismatch/fallback"] == 1.0
        assert first["mismatch/ess"] < 1 and 0 <= first["mismatch/truncated_frac"] <= 1
        assert t.engine.dtype == torch.float32  # re-cast: the engine reads the fp32 masters again
        assert t.engine.forward.embed is t.model.model.embed_tokens.weight
        assert summary["engine_dtype"] == "float32" and summary["engine_fallback"] is True
        warned = [r for r in caplog.records if "mismatch_kl_bound" in r.getMessage()]
        assert len(warned) == 1 and "falling back to fp32" in warned[0].getMessage()
    with trainer_for(tmp_path, "name=auto", "train.steps=3") as t:  # resumed: the fallback holds
        assert t.engine.dtype == torch.bfloat16
        t.prepare(resume=True)
        assert t.state.engine_fallback and t.engine.dtype == torch.float32 and t.summary()["engine_fallback"]


def test_a_run_resumed_on_another_machine_keeps_the_precision_it_started_in(tmp_path, monkeypatch, caplog):
    """Begun under auto on this AVX2 sample (fp32), resumed with its own config on a native-bf16 CPU:
    it goes on in fp32, with a warning, where auto there alone would sample and update in bf16 —
    and a checkpoint that does not record its precision (an older one) is taken as begun here."""
    import json

    import rollwise.hardware

    with trainer_for(tmp_path, "name=moved", "train.steps=1") as t:
        t.prepare()
        t.fit()
        assert t.state.precision == {"rollout.engine_dtype": "float32", "optim.compute_dtype": "float32"}
    own = [f"objective.tis_mode={t.cfg.objective.tis_mode}"]  # its own config: the AVX2 resolution of auto
    monkeypatch.setenv("ROLLWISE_CPUINFO", str(SAMPLES / "avx512_bf16_genoa.txt"))
    monkeypatch.setattr(rollwise.hardware, "bf16_speedup", lambda shapes, info=None: 2.0)
    with trainer_for(tmp_path, "name=moved", "train.steps=2", *own) as t:
        assert (t.engine.dtype, t.compute_dtype) == (torch.bfloat16, torch.bfloat16)  # what auto picks here
        with caplog.at_level("WARNING", logger="rollwise.train.precision"):
            t.prepare(resume=True)
        assert (t.engine.dtype, t.engine_dtype, t.compute_dtype) == (torch.float32,) * 3
        assert sum("the run started with" in r.getMessage() for r in caplog.records) == 2
        summary = t.fit()
        assert summary["engine_dtype"] == "float32" and summary["compute_dtype"] == "float32"
        assert "start precision" in summary["compute_dtype_reason"]
    state = tmp_path / "moved" / "checkpoints" / "step_000002" / "state.json"
    older = json.loads(state.read_text())
    del older["precision"]  # as written before runs recorded it
    state.write_text(json.dumps(older))
    with trainer_for(tmp_path, "name=moved", "train.steps=3", *own) as t:
        t.prepare(resume=True)
        assert t.engine.dtype == torch.bfloat16 and t.state.precision["rollout.engine_dtype"] == "bfloat16"
    # and pinning fp32 on such a checkpoint is judged against what auto picks here (bf16): refused
    from rollwise.train.resume import ResumeRefused

    with trainer_for(tmp_path, "name=moved", "train.steps=3", "rollout.engine_dtype=float32", *own) as t:
        with pytest.raises(ResumeRefused, match="the run computes in bfloat16"):
            t.prepare(resume=True)


def test_the_guard_only_warns_when_bf16_was_asked_for(tmp_path, caplog):
    with trainer_for(tmp_path, "name=asked", "rollout.engine_dtype=bfloat16", "train.steps=2") as t:
        assert t.cfg.objective.tis_mode == "token_truncate"  # the correction comes with it
        t.prepare()
        perturb(t.engine)
        with caplog.at_level("WARNING", logger="rollwise.train.precision"):
            summary = t.fit()
        assert t.engine.dtype == torch.bfloat16 and summary["engine_fallback"] is False
        assert any("rollout.engine_dtype=float32" in r.getMessage() for r in caplog.records)


def test_the_guard_on_its_own():
    from rollwise.train.precision import MismatchGuard

    class Engine:
        dtype = torch.bfloat16

        def set_dtype(self, dtype):
            self.dtype = dtype

    engine, guard = Engine(), MismatchGuard("auto", torch.bfloat16, 0.01)
    assert guard.check({"mismatch/kl_k3": 0.005}, [engine]) == {"mismatch/bound_exceeded": 0.0,
                                                                "mismatch/fallback": 0.0}
    assert engine.dtype == torch.bfloat16
    assert guard.check({"mismatch/kl_k3": 0.02}, [engine, None])["mismatch/fallback"] == 1.0
    assert engine.dtype == torch.float32
    assert guard.check({"mismatch/kl_k3": 0.02}, [engine])["mismatch/bound_exceeded"] == 0.0  # fp32 now: no bound


def test_the_async_producer_samples_from_its_own_copy_and_takes_the_fallback(tmp_path):
    """train.mode=async: the producer's engine casts the producer's own fp32 copy of the policy;
    a fallback reaches it at its next batch (never under a running generation)."""
    with trainer_for(tmp_path, "name=async", "train.mode=async", "rollout.engine_dtype=bfloat16",
                     "train.steps=3") as t:
        t.prepare()
        t.step()
        producer = t.pipeline
        assert producer.engine.dtype == torch.bfloat16 and producer.model.dtype == torch.float32
        assert producer.model is not t.model
        producer.set_dtype(torch.float32)
        t.step()  # the batch in flight when set_dtype was called may still be bf16's
        t.step()  # this one was begun after it
        assert producer.engine.dtype == torch.float32
        t.stop_pipeline()


def test_a_rollout_worker_samples_in_the_drivers_precision(tmp_path):
    """dist/: the driver's choice travels with each shard; the worker casts its own model's weights."""
    from rollwise.dist.worker import RolloutWorker
    from rollwise.train.config import load_run_config
    from rollwise.types import Prompt

    cfg = load_run_config(None, [f"output_dir={tmp_path}", "task.max_digits=1", "rollout.max_new_tokens=4",
                                 "rollout.num_generations=2"])
    worker = RolloutWorker(cfg.model_dump(mode="json"), type(cfg), score=False)
    assert worker.engine.dtype == torch.float32
    prompt = Prompt(id="p", text="1+1=", token_ids=worker.tokenizer("1+1=")["input_ids"], answer="2")
    result = worker.run([prompt], [2], seed=0, sync=-1, version=0, weights=[None], dtype=torch.bfloat16)
    assert worker.engine.dtype == torch.bfloat16 and worker.model.dtype == torch.float32
    assert len(result.groups[0].rollouts) == 2
    worker.close()


def test_hidden_states_leave_a_bf16_engine_in_float32(model):
    """A quality probe (control.method=arrol) reads the engine's hidden states with fp32 weights."""
    engine = engines(model, torch.bfloat16)[0]
    params = SamplingParams(max_new_tokens=3, keep_hidden=True, seed=0)
    (done,) = engine.generate([Request(PROMPTS[0], params)])
    assert done.hidden.dtype == torch.float32 and done.hidden.shape == (model.config.hidden_size,)
