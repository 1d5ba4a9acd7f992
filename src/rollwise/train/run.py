"""Drive a whole run: prepare, evaluate, step with a progress bar, checkpoint, summarise."""

from __future__ import annotations

import json
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rollwise.train.config import RunConfig
from rollwise.train.loop import Trainer


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"), console=console, transient=False,
    )


def run_training(cfg: RunConfig, resume: bool = False, console: Console | None = None) -> dict:
    console = console or Console()
    trainer = Trainer(cfg)
    tc = cfg.train
    with _progress(console) as bar:
        sft_bar = None
        if cfg.sft.steps and not resume:
            sft_bar = bar.add_task("SFT warm start", total=cfg.sft.steps, info="")

        def on_sft_step(step: int, loss: float) -> None:
            bar.update(sft_bar, completed=step + 1, info=f"loss {loss:.3f}")

        trainer.prepare(resume=resume, on_sft_step=on_sft_step if sft_bar is not None else None)
        if trainer.state.step == 0:
            result = trainer.record_eval()
            console.print(f"[bold]initial eval[/] accuracy {result.accuracy:.1%}  {_passk(result.pass_at)}")
        rl = bar.add_task(f"RL ({cfg.objective.method})", total=tc.steps, completed=trainer.state.step, info="")
        session_start = time.perf_counter()
        base_wall = trainer.state.wall_seconds
        while trainer.state.step < tc.steps:
            metrics = trainer.step()
            trainer.state.wall_seconds = base_wall + time.perf_counter() - session_start
            step = trainer.state.step
            trainer.log.log(step, metrics)
            info = f"reward {metrics['reward/mean']:.2f}  len {metrics['length/mean']:.0f}"
            out_of_time = tc.max_minutes is not None and trainer.state.wall_seconds > 60 * tc.max_minutes
            out_of_tokens = tc.max_generated_tokens is not None and trainer.state.generated_tokens >= tc.max_generated_tokens
            last = step == tc.steps or out_of_time or out_of_tokens
            if (tc.eval_every and step % tc.eval_every == 0) or last:
                result = trainer.record_eval()
                info += f"  eval {result.accuracy:.1%}"
                console.print(f"step {step}: eval accuracy {result.accuracy:.1%}  {_passk(result.pass_at)}")
            if (tc.checkpoint_every and step % tc.checkpoint_every == 0) or last:
                trainer.checkpoint()
            bar.update(rl, completed=step, info=info)
            if not console.is_terminal and step % max(1, tc.steps // 20) == 0:
                console.print(f"step {step}/{tc.steps}: {info}")  # no live bar in logs: a line every 5%
            if out_of_time or out_of_tokens:
                limit = f"max_minutes={tc.max_minutes}" if out_of_time else f"max_generated_tokens={tc.max_generated_tokens:,}"
                console.print(f"[yellow]train.{limit} reached at step {step}[/]")
                break
    summary = trainer.summary()
    (trainer.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    trainer.log.close()
    _print_summary(console, summary, trainer.run_dir)
    return summary


def _passk(pass_at: dict[int, float]) -> str:
    return "  ".join(f"pass@{k} {v:.1%}" for k, v in pass_at.items())


def _print_summary(console: Console, s: dict, run_dir) -> None:
    a0, a1 = s["initial_accuracy"], s["final_accuracy"]
    delta = (a1 - a0) * 100 if a0 is not None and a1 is not None else float("nan")
    console.print(
        f"[bold green]learned[/]: eval accuracy {a0:.1%} → {a1:.1%} ({delta:+.1f} points) "
        f"in {s['steps']} RL steps, {s['wall_seconds'] / 60:.1f} min, {s['generated_tokens']:,} generated tokens"
    )
    console.print(f"run directory: {run_dir}")
