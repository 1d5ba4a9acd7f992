"""LoRA (``model.lora``, model/lora.py): what trains, what the engine samples, the reference,
checkpoints and resume, export, and what is refused.

- a training step changes the adapters only: every base tensor is bit-identical, and the
  optimizer holds nothing else; a step with exactly zero loss changes nothing at all;
- the engines (slot and v1) sample from exactly the current policy: their behaviour log-probs
  equal the trainer's (HF and packed forwards) after the adapter moved, and differ from the base's;
- the packed forward gives the HF (peft) forward's log-probs and adapter gradients;
- the KL reference is the base with the adapters off, no second model;
- checkpoints hold the adapter, not the base; a crashed and resumed run leaves the uninterrupted
  run's files (sync and async); ``rollwise export --merged`` loads in plain transformers with
  the policy's logits;
- bad ``target_modules``, a missing peft, ReMix and an SFT warm start are ConfigErrors.
"""

import copy
import sys

import pytest
import torch
from runfiles import assert_same_run, crash_and_resume
from test_packed import _batch, _qwen2
from tinymodel import tiny_redrawn
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from rollwise.config import ConfigError
from rollwise.engine.engine import Engine, Request
from rollwise.engine.sampling import SamplingParams
from rollwise.engine.slots import SlotEngine
from rollwise.model.load import ModelConfig, load_model_and_tokenizer
from rollwise.model.logprobs import token_logprobs_and_entropy
from rollwise.model.lora import AdapterDisabled, LoraConfig, apply_lora, is_adapter, policy_state
from rollwise.model.packed import PackedForward
from rollwise.train.config import load_run_config
from rollwise.train.loop import Trainer

LORA = ["model.lora.r=4", "model.lora.alpha=8"]
ATOL = 1e-4  # the engine tests' tolerance: cached slot decode vs one padded forward


def sets(tmp_path, warm, name, *extra):
    return [f"output_dir={tmp_path}", f"name={name}", f"model.path={warm}", "task.max_digits=1", "task.eval_size=8",
            "model.threads=1", "train.eval_samples=0", "rollout.prompts_per_step=4", "rollout.num_generations=4",
            "rollout.max_new_tokens=24", "optim.micro_batch_size=8", "optim.lr=1e-2", *LORA, *extra]


def trainer(tmp_path, warm, name, *extra) -> Trainer:
    return Trainer(load_run_config(None, sets(tmp_path, warm, name, *extra)))


def lora_tiny(seed=0, **cfg):
    """The redrawn tiny model with adapters whose B is non-zero (a fresh adapter is the identity)."""
    model, tok = tiny_redrawn()
    model = apply_lora(model, LoraConfig(r=4, **cfg))
    randomize_b(model, seed)
    return model.eval(), tok


def randomize_b(model, seed=0, std=0.2):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=gen) * std)


def snapshot(model) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


# -- what trains -------------------------------------------------------------------------------

def test_a_step_trains_the_adapters_and_leaves_the_base_bit_identical(tmp_path, warm):
    with trainer(tmp_path, warm, "run", "train.steps=2", "train.eval_every=0", "train.checkpoint_every=0") as t:
        t.prepare()
        optimized = {id(p) for group in t.optimizer.param_groups for p in group["params"]}
        adapters = {id(p) for n, p in t.model.named_parameters() if is_adapter(n)}
        assert optimized == adapters and len(adapters) == 4 * 7 * 2  # layers × projections × (A, B)
        before = snapshot(t.model)
        metrics = [t.step() for _ in range(2)]
        after = snapshot(t.model)
    assert any(m["loss"] != 0 for m in metrics)  # real updates (the warm model's groups are mixed)
    # step 2 was sampled after step 1 moved the adapter: the engine's log-probs are the trainer's
    assert metrics[1]["logprob_gap/behavior_vs_policy"] < 1e-4, metrics[1]["logprob_gap/behavior_vs_policy"]
    base = [n for n in before if not is_adapter(n)]
    assert base and all(torch.equal(before[n], after[n]) for n in base)
    assert all(not torch.equal(before[n], after[n]) for n in before if ".lora_B." in n)  # B left zero


def test_a_zero_loss_run_changes_nothing(tmp_path, warm):
    # every reward equal → every advantage 0 → every row skipped: the loss and every gradient are
    # exactly zero, and AdamW (weight_decay 0) moves nothing, base or adapter
    with trainer(tmp_path, warm, "zero", "train.steps=2", "train.eval_every=0", "train.checkpoint_every=0",
                 "rewards=[{name: 'test_lora:constant_reward'}]", "optim.weight_decay=0") as t:
        t.prepare()
        before = snapshot(t.model)
        metrics = [t.step() for _ in range(2)]
        after = snapshot(t.model)
    assert all(m["loss"] == 0 and m["update/skipped_rows"] == 1 for m in metrics)
    assert all(torch.equal(before[n], after[n]) for n in before)


def constant_reward(prompts, completions, **_):
    return [0.5] * len(completions)


# -- what the engine samples -------------------------------------------------------------------

def recomputed(model, outs, pad_id, packed=False):
    """The trainer's log-probs of each completion's tokens (one right-padded forward, HF or packed)."""
    seqs = [o.prompt_ids + o.token_ids for o in outs]
    ids = torch.full((len(seqs), max(map(len, seqs))), pad_id)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), 1
    with torch.no_grad():
        if packed:
            lp, _ = PackedForward(model).logprobs(ids, mask, mask[:, 1:], with_entropy=False)
        else:
            lp, _ = token_logprobs_and_entropy(model, ids, mask, with_entropy=False)
    return [lp[i, len(o.prompt_ids) - 1 : len(o.prompt_ids) - 1 + len(o.token_ids)] for i, o in enumerate(outs)]


@pytest.mark.parametrize("kind", ["slots", "v1"])
def test_the_engine_samples_from_the_current_lora_policy(kind):
    model, tok = lora_tiny()
    frozen = {n: t.clone() for n, t in model.state_dict().items() if not is_adapter(n)}
    make = SlotEngine if kind == "slots" else Engine
    engine = make(model, pad_token_id=tok.pad_token_id, max_batch_size=4, seed=0)
    requests = [Request(tok(t)["input_ids"], SamplingParams(max_new_tokens=12, seed=i))
                for i, t in enumerate(["12+3=", "hello", "a", "99*9="])]
    for version in range(2):
        if version:  # the adapter moves in place, as an optimizer step moves it; load_weights publishes it
            randomize_b(model, seed=7)
            engine.load_weights(model)
        outs = engine.generate(requests)
        for packed in (False, True):
            for o, ref in zip(outs, recomputed(model, outs, tok.pad_token_id, packed)):
                torch.testing.assert_close(torch.tensor(o.logprobs), ref, atol=ATOL, rtol=0)
        with AdapterDisabled(model).module() as base:  # and the adapter matters: the base scores them otherwise
            gaps = [(torch.tensor(o.logprobs) - ref).abs().max()
                    for o, ref in zip(outs, recomputed(base, outs, tok.pad_token_id))]
        assert max(gaps) > 0.05
    assert all(torch.equal(t, model.state_dict()[n]) for n, t in frozen.items())  # merging copied, never wrote


# -- the training forward ----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_packed_equals_hf_under_lora(name):
    if name == "llama":
        model = lora_tiny(target_modules=["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"])[0]
    else:  # biased q/k/v, a tied head
        model = apply_lora(_qwen2(), LoraConfig(r=4))
        randomize_b(model)
    ids, attn, scored = _batch(model.config.vocab_size, [11, 4, 9, 3, 7, 12])
    out, grads = {}, {}
    for path in ("hf", "packed"):
        m = copy.deepcopy(model)
        lp, _ = (token_logprobs_and_entropy(m, ids, attn) if path == "hf"
                 else PackedForward(m).logprobs(ids, attn, scored))
        (lp * scored * torch.linspace(0.5, 2, lp.shape[1])).sum().backward()
        out[path] = lp.detach() * scored
        grads[path] = {n: p.grad for n, p in m.named_parameters() if p.grad is not None}
    torch.testing.assert_close(out["packed"], out["hf"], rtol=1e-5, atol=2e-5)
    assert set(grads["hf"]) == set(grads["packed"]) == {n for n, _ in model.named_parameters() if is_adapter(n)}
    scale = max(float(g.abs().max()) for g in grads["hf"].values())
    for n, g in grads["hf"].items():
        assert float(g.abs().max()) > 0, n  # A and B both get gradient (B ≠ 0)
        torch.testing.assert_close(grads["packed"][n], g, rtol=1e-3, atol=1e-4 * scale)


def test_packed_applies_lora_dropout_only_in_training():
    model = lora_tiny(dropout=0.5)[0]
    plain = lora_tiny(dropout=0.0)[0]  # the same weights (same seeds), no dropout
    ids, attn, scored = _batch(model.config.vocab_size, [9, 6])
    forward = lambda m: PackedForward(m).logprobs(ids, attn, scored, with_entropy=False)[0]  # noqa: E731
    with torch.no_grad():
        torch.testing.assert_close(forward(model.eval()), forward(plain), rtol=0, atol=0)
        assert not torch.allclose(forward(model.train()), forward(plain), atol=1e-3)
    model.eval()


# -- the reference -----------------------------------------------------------------------------

def test_the_reference_is_the_base_with_the_adapters_off():
    base, tok = tiny_redrawn()
    model = apply_lora(copy.deepcopy(base), LoraConfig(r=4))
    randomize_b(model)
    ids, attn, scored = _batch(model.config.vocab_size, [9, 6, 11])
    with torch.no_grad():
        want = token_logprobs_and_entropy(base, ids, attn, with_entropy=False)[0] * scored
        policy = token_logprobs_and_entropy(model, ids, attn, with_entropy=False)[0] * scored
        with AdapterDisabled(model).module() as ref:
            for got in (token_logprobs_and_entropy(ref, ids, attn, with_entropy=False)[0],
                        PackedForward(ref).logprobs(ids, attn, scored, with_entropy=False)[0]):
                torch.testing.assert_close(got * scored, want, rtol=1e-5, atol=2e-5)
        after = token_logprobs_and_entropy(model, ids, attn, with_entropy=False)[0] * scored
    assert not torch.allclose(policy, want, atol=1e-3)
    assert torch.equal(after, policy)  # the adapters are back on leaving the block
    assert all(p.requires_grad == is_adapter(n) for n, p in model.named_parameters())


def test_a_kl_run_uses_the_base_as_reference_without_a_second_model(tmp_path, warm):
    with trainer(tmp_path, warm, "kl", "objective.beta=0.1", "train.steps=2", "train.eval_every=0",
                 "train.checkpoint_every=0") as t:
        t.prepare()
        assert isinstance(t.ref_model, AdapterDisabled) and t.ref_model.model is t.model
        first = t.step()
        second = t.step()
    assert first["kl"] == pytest.approx(0, abs=1e-6)  # B = 0: the policy is the reference
    assert second["kl"] > 0  # the adapter moved away from the base


def test_difficulty_select_embeds_with_the_base_adapters_off(tmp_path, warm):
    """embeddings: start under LoRA: the fixed embedding model is the policy with its adapters off
    (no copy); after the adapters moved, a question embeds exactly as at the start."""
    from rollwise.types import Prompt

    with trainer(tmp_path, warm, "ds", "control.method=difficulty_select", "train.steps=3", "train.eval_every=0",
                 "train.checkpoint_every=0") as t:
        t.prepare()
        assert isinstance(t.embed_model, AdapterDisabled) and t.embed_model.model is t.model
        question = [Prompt("q", "7+5=")]
        before = t.controller.embed(question)
        ms = [t.step() for _ in range(3)]
        after = t.controller.embed(question)
    assert any(m["loss"] != 0 for m in ms) and ms[1]["control/embed_tokens"] > 0
    assert before.tobytes() == after.tobytes()  # the base, not the trained adapters


# -- checkpoints, resume, export ---------------------------------------------------------------

@pytest.mark.parametrize("extra", [[], ["train.mode=async", "train.generation_threads=1", "train.max_staleness=1",
                                        "objective.tis_mode=token_truncate"]])
def test_resume_leaves_the_files_of_the_uninterrupted_run(tmp_path, warm, extra):
    common = ["train.steps=5", "train.eval_every=2", "train.checkpoint_every=2", "train.eval_samples=2", *extra]
    crash_and_resume(lambda name: load_run_config(None, sets(tmp_path, warm, name, *common)), 3)
    files = assert_same_run(tmp_path / "full", tmp_path / "cut")
    assert "checkpoints/step_000005/adapter.safetensors" in files
    assert not any(f.endswith("model.safetensors") for f in files)  # no copy of the base anywhere
    from safetensors import safe_open

    with safe_open(str(tmp_path / "cut/checkpoints/step_000005/adapter.safetensors"), "pt") as f:
        assert f.keys() and all(is_adapter(k) for k in f.keys())


def test_export_loads_in_plain_transformers_with_the_policy_logits(tmp_path, warm):
    from rollwise.cli import app

    with trainer(tmp_path, warm, "run", "train.steps=2", "train.eval_every=0", "train.checkpoint_every=0") as t:
        t.prepare()
        t.fit()
        policy = t.model
    out = tmp_path / "merged"
    result = CliRunner().invoke(app, ["export", str(tmp_path / "run"), "--merged", str(out)])
    assert result.exit_code == 0, result.output
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    assert not any("lora" in n for n in merged.state_dict())  # a plain HF model
    ids = torch.tensor([[1, 20, 21, 40, 13, 50, 51, 52]])
    with torch.no_grad():
        want, got = policy(input_ids=ids).logits, merged(input_ids=ids).logits
        with AdapterDisabled(policy).module() as base:
            base_logits = base(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(base_logits, want, atol=1e-3)  # the adapter trained: the merge mattered
    assert (out / "tokenizer.json").exists()


def test_a_preset_run_keeps_its_base_as_a_plain_model(tmp_path):
    cfg = load_run_config(None, [f"output_dir={tmp_path}", "name=p", "train.steps=0", "model.threads=1",
                                 "task.eval_size=4", *LORA])
    with Trainer(cfg) as t:
        t.prepare()
        base = AutoModelForCausalLM.from_pretrained(tmp_path / "p" / "init_model")
        ids = torch.tensor([[1, 20, 21, 40]])
        with torch.no_grad():
            torch.testing.assert_close(base(input_ids=ids).logits, t.model(input_ids=ids).logits, rtol=0, atol=0)


def test_the_async_producer_shares_the_frozen_base(tmp_path, warm):
    from rollwise.train.pipeline import Pipeline

    with trainer(tmp_path, warm, "a", "train.mode=async", "train.generation_threads=1",
                 "objective.tis_mode=token_truncate", "train.steps=1") as t:
        t.prepare()
        p = Pipeline(t, 1)
        mine = dict(t.model.named_parameters())
        for n, q in p.model.named_parameters():
            assert (q is mine[n]) != is_adapter(n), n  # base shared, adapters the producer's own
        assert set(p.snapshots[0]) == set(policy_state(t.model))  # a version is the adapter only


# -- what is refused ---------------------------------------------------------------------------

def test_bad_target_modules_name_the_field():
    with pytest.raises(ConfigError, match=r"model\.lora\.target_modules: 'q_prj'.*did you mean 'q_proj'"):
        load_model_and_tokenizer(ModelConfig(device="cpu", lora={"target_modules": ["q_prj"]}))
    with pytest.raises(ConfigError, match=r"model\.lora\.target_modules: 'lm_head'"):
        load_model_and_tokenizer(ModelConfig(device="cpu", lora={"target_modules": ["lm_head"]}))
    with pytest.raises(ConfigError, match="target_modules"):  # an empty list is a validation error
        load_run_config(None, ["model.lora.target_modules=[]"])


def test_a_missing_peft_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # `import peft` raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'rollwise\[lora\]'"):
        load_model_and_tokenizer(ModelConfig(device="cpu", lora={}))
    load_model_and_tokenizer(ModelConfig(device="cpu"))  # full fine-tuning never imports it


@pytest.mark.parametrize("extra, match", [(["replay.method=remix"], "replay.method=remix"),
                                          (["sft.steps=5"], "sft.steps")])
def test_what_lora_does_not_compose_with_is_a_config_error(tmp_path, extra, match):
    with pytest.raises(ConfigError, match=match):
        Trainer(load_run_config(None, [f"output_dir={tmp_path}", *LORA, *extra]))


def test_resuming_with_lora_switched_is_a_config_error(tmp_path, warm):
    common = ["train.steps=1", "train.eval_every=0", "train.checkpoint_every=1"]
    with trainer(tmp_path, warm, "run", *common) as t:
        t.prepare()
        t.fit()
    plain = [s for s in sets(tmp_path, warm, "run", *common) if not s.startswith("model.lora")]
    with Trainer(load_run_config(None, plain)) as t:
        with pytest.raises(ConfigError, match=r"model.lora: \{.*\} → null \(the policy would be another model"):
            t.prepare(resume=True)  # refused from config.yaml, before the checkpoint loads
        from rollwise.train.checkpoint import latest_checkpoint, load_weights

        with pytest.raises(ConfigError, match="has no model.safetensors but has adapter.safetensors"):
            load_weights(latest_checkpoint(t.run_dir), t.model)  # a checkpoint read on its own says so too


def test_sft_with_lora_saves_a_merged_plain_model(tmp_path):
    from rollwise.cli import app

    out = tmp_path / "sft"
    args = ["sft", "--set", "sft.steps=3", "--set", "sft.batch_size=8", "--set", "model.threads=1",
            "--set", "model.lora.r=4", "--set", "sft.lr=0.05", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    merged = AutoModelForCausalLM.from_pretrained(out)
    base, _ = load_model_and_tokenizer(ModelConfig(device="cpu"))  # the preset the SFT started from
    assert not any("lora" in n for n in merged.state_dict())
    moved = [n for n, t in base.state_dict().items() if not torch.equal(t, merged.state_dict()[n])]
    assert moved and all(n.split(".")[-2].endswith("_proj") for n in moved)  # only the targeted linears


# -- Ray rollout workers -----------------------------------------------------------------------

@pytest.mark.slow  # ~22 s with its Ray cluster; LoRA in process and Ray workers are each tested apart
def test_ray_workers_sample_with_the_adapter_and_train_like_in_process(tmp_path, warm, ray_cluster):
    from rollwise.dist.pool import from_numpy

    def run(name, *extra):
        batches = []
        with trainer(tmp_path, warm, name, "train.steps=2", "train.eval_every=0", "train.checkpoint_every=0",
                     *extra) as t:
            t.prepare()
            train_on = t.train_on
            t.train_on = lambda batch, waited=0.0: (
                batches.append([[r.completion_ids for r in g.rollouts] for g in batch.groups]), train_on(batch, waited)
            )[1]
            t.fit()
            sent = set(from_numpy(ray_cluster_get(t.pool.weights[1]))) if t.pool is not None else None
            return batches, snapshot(t.model), sent

    local, w_local, _ = run("local")
    dist, w_dist, sent = run("dist", "rollout.workers=2")
    assert dist == local  # step 2 was sampled by workers holding the step-1 adapter
    assert all(torch.equal(w_local[k], w_dist[k]) for k in w_local)
    assert sent and all(is_adapter(k) for k in sent)  # a weight sync carries the adapter only


def ray_cluster_get(ref):
    import ray

    return ray.get(ref)


@pytest.mark.filterwarnings("ignore:fan_in_fan_out is set to False")  # peft's notice: it sets it for Conv1D
def test_a_gpt2_model_gets_adapters_on_its_conv1d_and_merges_exactly():
    # not Llama-family: the v1 engine and the HF forward (peft's own) run it; Conv1D stores W transposed
    from transformers import GPT2Config, GPT2LMHeadModel

    from rollwise.model.lora import merge_into_base

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=60, bos_token_id=0, eos_token_id=0)
    model = apply_lora(GPT2LMHeadModel(config), LoraConfig(r=2, target_modules=["c_attn", "c_fc"])).eval()
    randomize_b(model, std=0.1)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        policy = model(input_ids=ids).logits
        merged = merge_into_base(model)(input_ids=ids).logits
    assert not any("lora" in n for n in model.state_dict())
    torch.testing.assert_close(merged, policy, rtol=1e-5, atol=1e-5)
