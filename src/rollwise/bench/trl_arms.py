"""The two arms of ``rollwise bench trl`` (``bench/lockstep.py`` runs them a step at a time):
rollwise through its public API, and TRL's ``GRPOTrainer`` timed by wrapping two of its methods
and a callback (``bench/trl.py``'s docstring says what each phase counts)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from rollwise import hardware
from rollwise.bench.lockstep import Arm, rng_state
from rollwise.types import Prompt


class RollwiseArm(Arm):
    """rollwise through its public API: ``Trainer(cfg)``, ``prepare()``, ``fit(RunLimits(steps=N))``."""

    name = "rollwise"

    def __init__(self, run_cfg) -> None:
        from rollwise.train.loop import Trainer

        super().__init__(run_cfg.train.steps)
        self.trainer = Trainer(run_cfg)
        self.trainer.prepare()
        self.model, self.tokenizer = self.trainer.model, self.trainer.tokenizer
        self.own_evals: list[dict] = []
        self.rng = rng_state()

    def loop(self) -> None:
        from rollwise.train.state import RunLimits

        def on_eval(step: int, result) -> None:
            self.own_evals.append({"step": step, "accuracy": result.accuracy})
            if step == 0:
                self.mark_start()  # the step clock starts after rollwise's own initial eval

        def on_step(step: int, m: dict) -> None:
            self.step_done({"generate": m["time/generate"], "score": m["time/score"], "update": m["time/update"],
                            "step": m["time/step"], "reward": m["reward/mean"], "length": m["length/mean"],
                            "zero_signal": m["groups/zero_signal"]})

        with self.trainer:
            self.trainer.fit(RunLimits(steps=self.last_step), on_step=on_step, on_eval=on_eval)

    def result(self) -> dict:
        return super().result() | {"own_evals": self.own_evals, "precision": self.precision()}

    def precision(self) -> dict:
        """What this arm sampled and trained in: the engine's dtype at the end (the mismatch guard may
        have moved an ``auto`` bf16 engine to fp32: ``engine_fallback``) and the update's."""
        t = self.trainer
        return {"engine_dtype": _name(t.guard.dtype), "engine_dtype_reason": t.engine_dtype_reason,
                "engine_fallback": t.guard.fell_back, "update_dtype": _name(t.compute_dtype),
                "update_dtype_reason": t.compute_dtype_reason}


class TRLArm(Arm):
    """TRL's ``GRPOTrainer`` on the warm start, timed by wrapping two of its methods and a callback."""

    name = "trl"

    def __init__(self, args, warm_dir: Path, prompts: list[Prompt], reward: Callable) -> None:
        """``args``: the GRPOConfig; ``prompts``: rollwise's train stream, in order (step k sees the
        prompts rollwise's step k sees)."""
        from datasets import Dataset
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.trainer_callback import PrinterCallback, ProgressCallback
        from trl import GRPOTrainer

        from rollwise.model.load import encode_prompt

        super().__init__(args.max_steps)
        self.tokenizer = AutoTokenizer.from_pretrained(warm_dir)
        self.model = AutoModelForCausalLM.from_pretrained(warm_dir, dtype=torch.float32)
        chat = prompts[0].messages is not None and bool(getattr(self.tokenizer, "chat_template", None))
        # chat prompts as messages: TRL applies the chat template itself, as rollwise's encode_prompt does
        dataset = Dataset.from_list([{"prompt": p.messages if chat else p.text, **p.reward_columns()} for p in prompts])
        self.trainer = GRPOTrainer(model=self.model, reward_funcs=[reward], args=args, train_dataset=dataset,
                                   processing_class=self.tokenizer, callbacks=[_trl_clock(self)])
        for cb in (PrinterCallback, ProgressCallback):
            self.trainer.remove_callback(cb)
        trl_ids = self.trainer._tokenize_prompts([dataset[0]["prompt"]])[0][0]
        if list(trl_ids) != encode_prompt(self.tokenizer, prompts[0]):  # both arms must see the same tokens
            raise RuntimeError(f"TRL tokenizes the first prompt differently from rollwise: {list(trl_ids)} vs "
                               f"{encode_prompt(self.tokenizer, prompts[0])}")
        self.phase = {"generate": 0.0, "score": 0.0}
        self.trainer._generate = self._timed("generate", self.trainer._generate)
        self.trainer._calculate_rewards = self._timed("score", self.trainer._calculate_rewards)
        self.step_start = 0.0
        self.rng = rng_state()

    def _timed(self, phase: str, fn: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.phase[phase] += time.perf_counter() - start
        return wrapper

    def loop(self) -> None:
        self.trainer.train()

    def result(self) -> dict:
        return super().result() | {"precision": self.precision()}

    def precision(self) -> dict:
        """TRL's ``bf16`` and what its accelerator made of it (``mixed_precision``: bf16 autocast
        around the model's forward, in generation and in the update; the weights stay as loaded)."""
        args = self.trainer.args
        return {"bf16": bool(args.bf16), "dtype": "bfloat16" if args.bf16 else "float32",
                "mixed_precision": str(self.trainer.accelerator.mixed_precision),
                "weights": _name(next(self.model.parameters()).dtype)}

    def step_began(self) -> None:
        self.phase = {"generate": 0.0, "score": 0.0}
        self.step_start = time.perf_counter()

    def step_ended(self) -> None:
        step = time.perf_counter() - self.step_start
        m = self.trainer._metrics["train"]
        self.step_done({**self.phase, "update": step - sum(self.phase.values()), "step": step,
                        "reward": m["reward"][-1], "length": m["completions/mean_length"][-1],
                        "zero_signal": m["frac_reward_zero_std"][-1]})


def trl_bf16(precision: str, info: hardware.CpuInfo | None = None) -> bool:
    """TRL's ``bf16`` for the bench's ``precision``: ``auto`` is bf16 where the CPU (``info``,
    default this one) has native bf16, as rollwise's engine may then sample in bf16."""
    if precision != "auto":
        return precision == "bfloat16"
    return hardware.native_bf16(info or hardware.cpu_info())


SHORT = {"float32": "fp32", "bfloat16": "bf16"}


def precision_label(p: dict | None) -> str:
    """An arm's precision in a table cell: rollwise's engine and update dtypes, TRL's bf16 flag."""
    if not p:
        return "-"
    if "engine_dtype" in p:
        fallback = " (fell back)" if p["engine_fallback"] else ""
        return f"engine {SHORT.get(p['engine_dtype'], p['engine_dtype'])}{fallback}, " \
               f"update {SHORT.get(p['update_dtype'], p['update_dtype'])}"
    return "bf16 autocast" if p["bf16"] else "fp32"


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _trl_clock(arm: TRLArm):
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            arm.mark_start()  # after the trainer's own setup (optimizer, dataloader)

        def on_step_begin(self, args, state, control, **kwargs):
            arm.step_began()

        def on_step_end(self, args, state, control, **kwargs):
            arm.step_ended()

    return Clock()
