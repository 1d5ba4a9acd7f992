"""Drive a whole run: prepare, evaluate, step with a progress bar, checkpoint, summarise, report."""

from __future__ import annotations

import contextlib
import json
import shlex
import signal
import threading
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rollwise.train import resume as resume_rules
from rollwise.train import rundir
from rollwise.train.checkpoint import latest_checkpoint
from rollwise.train.config import RunConfig
from rollwise.train.loop import Trainer
from rollwise.train.outcome import closing_lines


class Interrupts:
    """Ctrl-C that is never lost. Python's own SIGINT handler raises KeyboardInterrupt wherever the
    main thread is; raised inside a ``__del__`` or a weakref finalizer (a worker's, a tensor's) it is
    printed as "Exception ignored" and the run goes on to its end. This handler raises it the same
    way and also remembers it: ``check()`` at every step and eval raises it again until it lands."""

    def __init__(self):
        self.pending = threading.Event()

    def handler(self, signum, frame):
        self.pending.set()
        raise KeyboardInterrupt

    def check(self) -> None:
        if self.pending.is_set():
            raise KeyboardInterrupt


@contextlib.contextmanager
def catch_interrupts():
    """``Interrupts`` installed for SIGINT while the block runs, where Python's own Ctrl-C handler is
    (the main thread; not where SIGINT is ignored, as in a shell's background job, nor replaced by
    the caller): elsewhere ``check()`` never raises."""
    interrupts = Interrupts()
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield interrupts
        return
    previous = signal.signal(signal.SIGINT, interrupts.handler)
    try:
        yield interrupts
    finally:
        signal.signal(signal.SIGINT, previous)


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"), console=console, transient=False,
    )


def run_training(cfg: RunConfig, resume: bool = False, console: Console | None = None, overwrite: bool = False) -> dict:
    """Train ``cfg`` with a progress bar: ``Trainer.prepare`` (SFT warm start or resume), then ``Trainer.fit``.
    ``overwrite``: replace a run already in the run directory (else that is refused, before the model loads)."""
    console = console or Console()
    tc = cfg.train
    run_dir = Path(cfg.output_dir) / cfg.name
    if ckpt := rundir.check_start(run_dir, resume, overwrite):  # refused before minutes of model loading
        resume_rules.check_changes(run_dir, cfg.model_dump(mode="json"), resume_rules.start_precision(ckpt))
    with catch_interrupts() as interrupts, Trainer(cfg) as trainer, _progress(console) as bar:
        sft_bar = None
        if cfg.sft.steps and not resume:
            sft_bar = bar.add_task("SFT warm start", total=cfg.sft.steps, info="")

        def on_sft_step(step: int, loss: float) -> None:
            bar.update(sft_bar, completed=step + 1, info=f"loss {loss:.3f}")

        trainer.prepare(resume=resume, on_sft_step=on_sft_step if sft_bar is not None else None, overwrite=overwrite)
        if trainer.resumed_from is not None:
            console.print(f"resuming {trainer.run_dir} from step {trainer.state.step} (checkpoint "
                          f"{trainer.resumed_from})", highlight=False, soft_wrap=True)
            for change in trainer.config_changes:  # recorded in config_changes.jsonl
                console.print(f"  changed on resume: {change}", highlight=False, soft_wrap=True)
        rl = bar.add_task(f"RL ({cfg.objective.method})", total=tc.steps, completed=trainer.state.step, info="")
        info = {"text": ""}

        def on_step(step: int, metrics: dict) -> None:
            interrupts.check()
            info["text"] = f"reward {metrics['reward/mean']:.2f}  len {metrics['length/mean']:.0f}"
            bar.update(rl, completed=step, info=info["text"])
            if not console.is_terminal and step % max(1, tc.steps // 20) == 0:
                console.print(f"step {step}/{tc.steps}: {info['text']}")  # no live bar in logs: a line every 5%

        def on_eval(step: int, result) -> None:
            interrupts.check()
            label = "initial eval" if step == 0 else f"step {step}: eval"
            console.print(f"[bold]{label}[/] accuracy {result.accuracy:.1%}  {_passk(result.pass_at, result.maj_at)}")
            bar.update(rl, info=f"{info['text']}  eval {result.accuracy:.1%}")

        summary = trainer.fit(on_step=on_step, on_eval=on_eval)
        report = trainer.write_report()  # a failure is a warning, never a failed run
        if trainer.stopped_by and not trainer.stopped_by.startswith("steps="):
            console.print(f"[yellow]train.{trainer.stopped_by} reached at step {trainer.state.step}[/]")
    _print_summary(console, summary, trainer.run_dir)
    if report is not None:
        console.print(f"report: {report}")
    return summary


def _passk(pass_at: dict[int, float], maj_at: dict[int, float]) -> str:
    return "  ".join([f"pass@{k} {v:.1%}" for k, v in pass_at.items()]
                     + [f"maj@{k} {v:.1%}" for k, v in maj_at.items()])


def _print_summary(console: Console, s: dict, run_dir) -> None:
    a0, a1 = s["initial_accuracy"], s["final_accuracy"]
    cost = f"{s['steps']} RL steps, {s['wall_seconds'] / 60:.1f} min, {s['generated_tokens']:,} generated tokens"
    if a0 is None or a1 is None:  # no eval split (closing_lines says so)
        console.print(f"[bold green]trained[/]: {cost}")
    else:
        console.print(f"[bold green]learned[/]: eval accuracy {a0:.1%} → {a1:.1%} ({(a1 - a0) * 100:+.1f} points) "
                      f"in {cost}")
    for line in closing_lines(s):  # no eval, failed reward functions, nothing trained
        console.print(line)
    console.print(f"run directory: {run_dir}")


def print_interrupted(run_dir: Path, recipe: Path | None, sets: list[str], err: Console) -> None:
    """After Ctrl-C: the run's last checkpoint and the exact command that resumes it (the same
    recipe and --set values: a resume refuses other values of most keys), on ``err``."""
    words = ["rollwise", "train", *([str(recipe)] if recipe else []), *[w for s in sets for w in ("--set", s)]]
    ckpt = latest_checkpoint(run_dir) if run_dir.is_dir() else None
    if ckpt is None:
        again = [*words, "--overwrite"] if run_dir.is_dir() and rundir.run_files(run_dir) else words
        err.print(f"interrupted before the first checkpoint of {run_dir}: nothing to resume; start again with "
                  f"{shlex.join(again)}", markup=False, highlight=False)
        return
    step = json.loads((ckpt / "state.json").read_text())["step"]
    err.print(f"interrupted: last checkpoint {ckpt} (step {step}); steps after it are not kept. Resume with:",
              markup=False, highlight=False)
    err.print(f"  {shlex.join([*words, '--resume'])}", markup=False, highlight=False)
