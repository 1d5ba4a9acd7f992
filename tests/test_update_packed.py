"""The packed update (``optim.forward``) trains exactly as the HF module's padded forward does.

Each case runs one ``policy_update`` twice from the same weights — packed (its groups' shared
prompts computed once) and HF — and checks the loss, the metrics and every parameter's gradient agree; one case counts the rows
the packed path really ran (skipping still applies), and ``optim.forward`` resolves to the
packed forward on Llama-family models, to HF elsewhere, with a clear error when forced.
"""

import copy

import pytest
import torch
from test_loop import _groups
from transformers import GPT2Config, GPT2LMHeadModel

from rollwise.config import ConfigError
from rollwise.model import packed as packed_module
from rollwise.optim.batch import build_batch
from rollwise.optim.objective import ObjectiveConfig, assign_advantages
from rollwise.optim.update import UpdateSpec, policy_update
from rollwise.train.build import packed_forward

CASES = {
    "grpo": ({"method": "grpo"}, {}),
    "dapo": ({"method": "dapo"}, {}),
    "gspo_2_iterations": ({"method": "gspo"}, {"passes": 2}),
    "cispo": ({"method": "cispo"}, {}),
    "ppo_clip_2_iterations": ({"method": "ppo_clip"}, {"passes": 2}),
    "kl_reference": ({"method": "grpo", "beta": 0.1, "kl_estimator": "k3"}, {"ref": True}),
    "top_k_top_p": ({"method": "grpo"}, {"top_k": 5, "top_p": 0.9, "temperature": 0.8}),
    "entropy_quantile": ({"method": "high_entropy_steps"}, {}),
    "chunked_head": ({"method": "grpo"}, {"logits_budget_mb": 0.01}),
}


def _update(model, ref, batch, objective, packed: bool, options: dict) -> tuple[dict, dict]:
    m = copy.deepcopy(model)
    opt = torch.optim.SGD(m.parameters(), lr=0.0)  # gradients only: the comparison is of one pass
    options = dict(options)
    ref = ref if options.pop("ref", False) else None
    spec = UpdateSpec(objective, micro_batch_size=5, max_grad_norm=1e9, max_len=24, packed=packed, **options)
    metrics = policy_update(m, opt, copy.deepcopy(batch), spec, ref)
    return metrics, {n: p.grad.clone() for n, p in m.named_parameters()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_packed_update_equals_hf(tiny, case):
    model, tok = tiny
    fields, options = CASES[case]
    objective = ObjectiveConfig(**fields)
    groups = _groups(tok)
    assign_advantages(groups, objective)
    batch = build_batch(groups, tok.pad_token_id)
    ref = copy.deepcopy(model)
    with torch.no_grad():  # a reference that differs from the policy, so the KL term is not 0
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    hf, g_hf = _update(model, ref, batch, objective, False, options)
    packed, g_packed = _update(model, ref, batch, objective, True, options)
    assert hf.keys() == packed.keys()
    # the groups' rows repeat their prompt: the packed forward computed it once (optim.share_prompts)
    assert hf.pop("update/prompt_tokens_shared") == 0 < packed.pop("update/prompt_tokens_shared")
    for key in hf:
        assert packed[key] == pytest.approx(hf[key], rel=1e-4, abs=1e-6), key
    scale = max(float(g.abs().max()) for g in g_hf.values())
    assert scale > 0 or case == "gspo_2_iterations"  # GSPO's tiny clip can zero the second pass
    for name, g in g_hf.items():
        torch.testing.assert_close(g_packed[name], g, rtol=1e-3, atol=1e-4 * max(scale, 1e-12), msg=name)


def test_packed_update_runs_only_rows_with_signal(tiny, monkeypatch):
    model, tok = tiny
    objective = ObjectiveConfig()
    groups = _groups(tok)
    assign_advantages(groups, objective)
    batch = build_batch(groups, tok.pad_token_id)
    seen = []
    original = packed_module.PackedForward.logprobs

    def counting(self, input_ids, *args, **kwargs):
        seen.append(input_ids.shape[0])
        return original(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(packed_module.PackedForward, "logprobs", counting)
    hf_calls = []
    m = copy.deepcopy(model)
    m.register_forward_hook(lambda *a: hf_calls.append(1))
    metrics = policy_update(m, torch.optim.SGD(m.parameters(), lr=1e-3), batch,
                            UpdateSpec(objective, micro_batch_size=4, max_len=24, packed=True))
    assert sum(seen) == 6 and metrics["update/skipped_rows"] == pytest.approx(0.5)  # 6 of 12 rows carry signal
    assert not hf_calls  # the HF module's forward never ran


def test_forward_choice(tiny):
    model, _ = tiny
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=32, n_embd=32, n_layer=1, n_head=2))
    assert packed_forward("auto", model) is True and packed_forward("hf", model) is False
    assert packed_forward("auto", gpt2) is False
    with pytest.raises(ConfigError, match="optim.forward=packed.*gpt2.*optim.forward=auto or hf"):
        packed_forward("packed", gpt2)


@pytest.mark.parametrize("choice", ["auto", "hf"])
def test_the_trainer_updates_with_the_chosen_forward(tmp_path, monkeypatch, choice):
    from test_loop import trainer_for

    calls = []
    original = packed_module.PackedForward.logprobs
    monkeypatch.setattr(packed_module.PackedForward, "logprobs",
                        lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    with trainer_for(tmp_path, "sft.steps=0", "optim.skip_zero_advantage=false", f"optim.forward={choice}") as t:
        assert t.packed is (choice == "auto")
        t.step()
    assert bool(calls) is (choice == "auto")  # the packed forward ran in the trainer's update, or never
