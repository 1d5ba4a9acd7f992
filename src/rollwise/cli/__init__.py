"""``rollwise``: train | sft | export | eval | calibrate | report | serve | list | bench.

Errors a user can fix (config, paths, data) print one line and exit 2; set
``ROLLWISE_DEBUG=1`` for the traceback.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from rollwise.cli.bench import bench_app
from rollwise.cli.common import RecipeArg, SetOpt, console, friendly_errors

app = typer.Typer(add_completion=False, no_args_is_help=True, help="RL with verifiable rewards, built around the rollout.")


@app.callback()
def _log_setup() -> None:
    """rollwise's own notices (what the sandbox detected, an engine fallback) reach the terminal."""
    import logging

    from rich.logging import RichHandler

    log = logging.getLogger("rollwise")
    if not log.handlers:
        log.addHandler(RichHandler(console=Console(stderr=True), show_time=False, show_path=False))
        log.setLevel(logging.INFO)
        log.propagate = False


app.add_typer(bench_app, name="bench")


@app.command()
@friendly_errors
def train(
    recipe: RecipeArg = None,
    set_: SetOpt = None,
    resume: Annotated[bool, typer.Option("--resume", help="continue from the run's latest checkpoint")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace the run already in runs/<name> (removes "
                                            "only the files rollwise wrote there)")] = False,
):
    """Run RL (with the recipe's SFT warm start first, if any). A name that already holds a run is refused
    unless --resume or --overwrite."""
    from rollwise.train.config import load_run_config
    from rollwise.train.run import print_interrupted, run_training

    cfg = load_run_config(str(recipe) if recipe else None, set_ or [])
    try:
        run_training(cfg, resume=resume, console=console, overwrite=overwrite)
    except KeyboardInterrupt:  # Ctrl-C: say what is kept and how to go on, exit as SIGINT does (128 + 2)
        print_interrupted(Path(cfg.output_dir) / cfg.name, recipe, set_ or [], Console(stderr=True, soft_wrap=True))
        raise typer.Exit(130) from None


@app.command()
@friendly_errors
def sft(
    recipe: RecipeArg = None,
    set_: SetOpt = None,
    out: Annotated[Path, typer.Option(help="directory to save the warm-started model")] = Path("runs/sft_model"),
    check: Annotated[int, typer.Option(help="held-out prompts for the check after SFT: greedy episodes through the "
                                       "recipe's environment (accuracy, tool-call parse rate, right calls), or "
                                       "completions without one (accuracy); 0 = no check")] = 50,
):
    """Supervised warm start on the task's demonstrations (rendered as the recipe's episodes are); saves a
    Hugging Face model directory, and the held-out check in <out>/sft_check.json."""
    import time

    from rollwise.config import ConfigError
    from rollwise.model.lora import merge_into_base
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer
    from rollwise.train.sft import warm_start
    from rollwise.train.sft_check import held_out_check, write_check

    cfg = load_run_config(str(recipe) if recipe else None, set_ or [])
    if cfg.sft.steps == 0:
        raise ConfigError("sft.steps is 0: nothing to train (pass --set sft.steps=300)")
    # the run's task, model, engine, environment and judge, no run directory; built as for RL from the
    # warm-started model (sft.steps=0: with model.lora, SFT here is what a LoRA run is then pointed at)
    with Trainer(cfg.model_copy(update={"sft": cfg.sft.model_copy(update={"steps": 0})})) as trainer:
        start = time.perf_counter()
        with console.status("SFT") as status:
            losses = warm_start(trainer, on_step=lambda s, loss: status.update(
                f"SFT step {s + 1}/{cfg.sft.steps} loss {loss:.3f}"), settings=cfg.sft)
        minutes = (time.perf_counter() - start) / 60
        result = held_out_check(trainer, check) if check else None
        merge_into_base(trainer.model).save_pretrained(out)  # model.lora: the adapter folded in (else unchanged)
        trainer.tokenizer.save_pretrained(out)
    console.print(f"SFT {cfg.sft.steps} steps ({minutes:.1f} min): loss {losses[0]:.3f} → {losses[-1]:.3f}; saved {out}")
    if result is not None:
        console.print(result.line(), highlight=False)
        write_check(out, cfg, losses, minutes, result)


@app.command()
@friendly_errors
def export(
    run_dir: Annotated[Path, typer.Argument(help="a run directory (runs/<name>)")],
    merged: Annotated[Path, typer.Option("--merged", help="write the policy here as a plain Hugging Face model "
                                                          "directory (a LoRA adapter merged into the base)")],
):
    """Save a run's latest checkpoint as a model transformers loads alone (docs/lora.md)."""
    from rollwise.train.export import export_merged

    out = export_merged(run_dir, merged)
    console.print(f"exported {run_dir} → {out}")


@app.command("eval")
@friendly_errors
def eval_(
    recipe: RecipeArg = None,
    set_: SetOpt = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="also write the results here")] = None,
):
    """Greedy accuracy, pass@k and maj@k of `model.path` (or the preset) on the task's eval split, and on an
    environment task the episodes' tool use (calls per episode, unparseable calls, call errors, turns, failed
    episodes). `model.path` may be a run directory (its latest checkpoint's policy) or a checkpoint: `rollwise
    eval RECIPE --set model.path=runs/NAME`."""
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    cfg = load_run_config(str(recipe) if recipe else None, set_ or [])
    with Trainer(cfg) as trainer:  # its engine samples in rollout.engine_dtype's choice (logged), as in training
        result = trainer.evaluate()  # the trainer's own eval: same prompts, judge, engine and seeds
    record = result.metrics() | {"engine_dtype": _dtype_name(trainer.engine_dtype),
                                 "engine_dtype_reason": trainer.engine_dtype_reason}
    console.print(_eval_table(result.table(), len(result.correct)))
    console.print(json.dumps(record, indent=2))
    if json_path:
        json_path.write_text(json.dumps(record, indent=2))


@app.command()
@friendly_errors
def calibrate(
    recipe: RecipeArg = None,
    set_: SetOpt = None,
    out: Annotated[Path, typer.Option("--out", help="the calibration JSON (task.select.path reads it)")] = Path(
        "calibration.json"),
    prompts: Annotated[int, typer.Option(min=1, help="the first N train prompts")] = 300,
    k: Annotated[int, typer.Option(min=1, help="sampled completions per prompt")] = 8,
    overwrite: Annotated[bool, typer.Option(help="replace an existing --out")] = False,
):
    """The starting model's pass@k on the first N train prompts (sampled as training samples), each
    prompt sorted into never / mixed / always solved, for `task.select` to train on (docs/tasks.md).
    Resumable: rerun the same command after an interruption."""
    from rollwise.train.calibrate import calibrate as run
    from rollwise.train.config import load_run_config

    cfg = load_run_config(str(recipe) if recipe else None, set_ or [])
    with console.status("calibrating") as status:
        record = run(cfg, out, prompts, k, overwrite=overwrite,
                     on_chunk=lambda done, total: status.update(f"calibrating: {done}/{total} prompts"))
    s = record["split"]
    console.print(f"pass@{k} of {len(record['prompts'])} prompts: never {s['never']}, mixed {s['mixed']}, always "
                  f"{s['always']}; wrote {out}")


def _eval_table(rows: list[tuple[str, str]], prompts: int):
    from rich.table import Table

    table = Table(title=f"eval: {prompts} prompts", show_header=False, title_justify="left")
    for label, value in rows:
        table.add_row(label, value)
    return table


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _log_engine_dtype(dtype, reason: str) -> None:
    import logging

    logging.getLogger("rollwise").info("the engine samples in %s (%s)", _dtype_name(dtype), reason)


@app.command()
@friendly_errors
def report(
    run_dirs: Annotated[list[Path], typer.Argument(help="run directories (runs/<name>); several are overlaid")],
    out: Annotated[Path | None, typer.Option("--out", help="where to write it (default: RUN_DIR/report.html for "
                                                           "one run, ./report.html for several)")] = None,
):
    """One self-contained report.html: curves, config diff, eval rollouts, a rollout tree (no server, no network)."""
    from rollwise.report import write_report

    console.print(f"report: {write_report(run_dirs, out)}")


@app.command()
@friendly_errors
def serve(
    model: Annotated[str, typer.Argument(help="a local Hugging Face model directory, a .gguf file, a pkg: path, a "
                                              "run directory (its latest checkpoint) or checkpoint, or a tiny "
                                              "preset name (tiny, small, medium)")],
    host: Annotated[str, typer.Option(help="interface to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port (0 = a free one)")] = 8000,
    name: Annotated[str | None, typer.Option(help="the served model id (default: the directory's or file's name)")] = None,
    max_batch_size: Annotated[int, typer.Option(help="engine slots: requests sampled together")] = 32,
    seed: Annotated[int, typer.Option(help="seeds requests that name no seed")] = 0,
    tool_format: Annotated[str, typer.Option(help="tool-call format: auto (hermes with a chat template, else plain) "
                                                  "| hermes | plain")] = "auto",
    max_tokens: Annotated[int, typer.Option(help="completion cap when a request sets no max_tokens")] = 512,
    api_key: Annotated[str | None, typer.Option(envvar="ROLLWISE_API_KEY", show_envvar=True,
                                                help="clients must send it (Authorization: Bearer); required "
                                                     "when --host is not loopback")] = None,
    max_model_len: Annotated[int, typer.Option(help="most prompt + max_tokens a request may ask (the engine's "
                                                    "cache grows to the longest one; 0 = the model's context)")] = 4096,
    kv_cache_mb: Annotated[float, typer.Option(help="MB of episode caches kept to continue from")] = 1024.0,
    max_body_mb: Annotated[float, typer.Option(help="largest request body, MB (413 past it)")] = 8.0,
    engine_dtype: Annotated[str, typer.Option(help="the precision the engine samples in: auto (bf16 on a CPU with "
                                                   "native bf16 where it measures faster, else fp32; as "
                                                   "rollout.engine_dtype) | float32 | bfloat16")] = "auto",
):
    """An OpenAI-compatible /v1/chat/completions on the engine, until Ctrl-C (docs/serve.md)."""
    import signal
    import threading

    from rollwise.config import ConfigError
    from rollwise.engine.slots import SlotEngine
    from rollwise.model.load import ModelConfig, load_model_and_tokenizer
    from rollwise.model.tiny import PRESETS
    from rollwise.tasks.tool_calls import tool_format as pick_format

    try:
        from rollwise.serve import serve_engine
    except ImportError as err:
        raise ConfigError(f"rollwise serve needs the serve extra ({err.name} is missing): "
                          "pip install 'rollwise[serve]'") from None
    from rollwise.serve.app import LOOPBACK

    if host.lower().strip("[]") not in LOOPBACK and not api_key:
        raise ConfigError(f"--host {host} is not loopback: anyone who can reach it could sample (and, in a run, "
                          "train) the model — pass --api-key KEY (or set ROLLWISE_API_KEY), e.g. "
                          "--api-key $(python -c 'import secrets; print(secrets.token_urlsafe())')")
    cfg = ModelConfig(preset=model) if model in PRESETS else ModelConfig(path=model)
    with console.status(f"loading {model}"):
        policy, tok = load_model_and_tokenizer(cfg, seed=seed)
    try:
        fmt = pick_format(tool_format, tok)
    except ValueError as err:
        raise ConfigError(f"--tool-format: {err}") from None
    dtype, reason = _serve_dtype(engine_dtype, policy)
    engine = SlotEngine(policy, pad_token_id=tok.pad_token_id, max_batch_size=max_batch_size, seed=seed, dtype=dtype)
    path = Path(model.removeprefix("pkg:"))
    served = name or (model if model in PRESETS else path.stem if path.suffix.lower() == ".gguf" else path.name)
    try:
        server = serve_engine(engine, tok, fmt, model_name=served, seed=seed, default_max_tokens=max_tokens,
                              host=host, port=port, api_key=api_key, max_model_len=max_model_len or None,
                              kv_cache_mb=kv_cache_mb, max_body_mb=max_body_mb)
    except RuntimeError as err:  # the port is taken
        raise ConfigError(str(err)) from None
    console.print(f"serving '{served}' ({fmt.name} tool calls, engine {_dtype_name(dtype)}: {reason}) at "
                  f"{server.url} — Ctrl-C stops", highlight=False, soft_wrap=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        server.drive(stop.is_set)
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


def _serve_dtype(choice: str, policy):
    """``--engine-dtype``: the engine's precision and why, by training's rule (``train/precision.py``)."""
    from rollwise.config import ConfigError
    from rollwise.train.precision import DTYPES, choose

    if choice != "auto" and choice not in DTYPES:
        raise ConfigError(f"--engine-dtype {choice}: use auto, {', '.join(DTYPES)}")
    dtype, reason = choose(choice, policy)
    reason = reason if choice == "auto" else f"--engine-dtype {choice}"
    _log_engine_dtype(dtype, reason)
    return dtype, reason


@app.command("list")
def list_(what: Annotated[str, typer.Argument(
        help="tasks | rewards | environments | objectives | strategies | controllers | replay | diagnostics | "
             "settings | all")] = "all"):
    """What this install knows: tasks, rewards, environments, objectives, rollout strategies, controllers,
    replay methods, diagnostics, and the methods that are a setting of one of them."""
    from rollwise.control import CONTROLLERS
    from rollwise.eval.support import DIAGNOSTICS
    from rollwise.filter.registry import builtin_rewards
    from rollwise.generate import STRATEGIES
    from rollwise.replay import REPLAY_METHODS
    from rollwise.tasks.registry import TASKS
    from rollwise.train.config import SETTING_METHODS

    tables = {
        "tasks": {name: plain_summary(cls.__doc__) for name, cls in TASKS.items()},
        "rewards": {name: plain_summary(fn.__doc__) for name, fn in builtin_rewards().items()},
        "environments": _environment_rows(),
        "objectives": _objective_rows(),
        **{name: {key: plain_summary(doc) for key, doc in rows.items()}
           for name, rows in (("strategies", STRATEGIES), ("controllers", CONTROLLERS), ("replay", REPLAY_METHODS),
                              ("diagnostics", DIAGNOSTICS))},
        "settings": SETTING_METHODS,
    }
    if what != "all" and what not in tables:
        console.print(f"[red]error:[/] unknown list '{what}'; choose one of {', '.join(tables)}, all")
        raise typer.Exit(2)
    for name, rows in tables.items():
        if what in ("all", name):
            console.print(f"[bold]{name}[/]")
            for key, doc in rows.items():
                console.print(f"  {key:<18} {doc}", highlight=False, markup=False, soft_wrap=True)


def _environment_rows() -> dict[str, str]:
    """The built-in ``rollout.environment`` names: the class's summary and its tools (public methods
    but the contract's own), then the other forms the key takes."""
    import importlib
    import inspect

    from rollwise.tasks.environment import ENVIRONMENTS, RESERVED

    rows = {}
    for name, target in ENVIRONMENTS.items():
        module, _, attr = target.partition(":")
        cls = getattr(importlib.import_module(module), attr)
        tools = [t for t, _ in inspect.getmembers(cls, inspect.isfunction)
                 if not t.startswith("_") and t not in RESERVED]
        rows[name] = f"{plain_summary(cls.__doc__)} tools: {', '.join(tools)}"
    rows["package.module:Class"] = "your class, TRL's environment_factory contract: reset(**row), methods are tools"
    rows["openenv:<url>"] = "an OpenEnv server's environment over its WebSocket (rollwise[openenv])"
    return rows


def _objective_rows() -> dict[str, str]:
    """One row per objective preset; a name that is another id for the same preset (``sapo_gate``,
    the methods catalogue's id for ``sapo``) is shown in its preset's row, not as a second row."""
    from rollwise.optim.config import PRESETS

    aliases: dict[int, list[str]] = {}
    for name, preset in PRESETS.items():
        aliases.setdefault(id(preset), []).append(name)
    rows = {}
    for first, *others in aliases.values():
        also = f"(also {', '.join(others)}) " if others else ""
        rows[first] = also + _objective_row(first, PRESETS[first])
    return rows


def plain_summary(doc: str | None) -> str:
    r"""A docstring's first paragraph as one line of plain text: ``rollwise list`` prints words, not
    reStructuredText (double backquotes, ``:role:`` prefixes and single backquotes are dropped).

    >>> plain_summary(":func:`check` each completion:\n  the number after ``#`` equals ``answer``.\n\nMore.")
    'check each completion: the number after # equals answer.'
    """
    first = (doc or "").strip().split("\n\n")[0]
    text = " ".join(first.split())
    text = re.sub(r"``(.+?)``", r"\1", text)
    text = re.sub(r":[a-z]+(?::[a-z]+)?:`(.+?)`", r"\1", text)
    return re.sub(r"`([^`]+)`", r"\1", text)


def _objective_row(method: str, preset: dict) -> str:
    """A preset's fields, the other sections it fills (dapo: control.method) and its off-policy note."""
    from rollwise.optim.config import PRESET_SECTIONS

    fields = [f"{k}={v}" for k, v in preset.items()]
    for section, fill in PRESET_SECTIONS.get(method, {}).items():
        fields += [f"{section}.{k}={v}" for k, v in fill.items()]
    return ", ".join(fields) + f"  ({_off_policy_note(method)})"


def _off_policy_note(method: str) -> str:
    """Whether objective preset ``method`` weights stale tokens (async, replay, APRIL) by an importance
    weight on the behaviour/proximal gap: on its own, or through the run config's default for such runs."""
    from rollwise.train.config import RunConfig

    sync = RunConfig.model_validate({"objective": {"method": method}}).objective
    stale = RunConfig.model_validate({"objective": {"method": method}, "train": {"mode": "async"}}).objective
    if sync.corrects_off_policy:
        return f"off-policy: yes, tis_mode={sync.tis_mode}"
    if stale.corrects_off_policy:
        return f"off-policy: yes, tis_mode={stale.tis_mode} in async/replay/april runs; {sync.tis_mode} in sync"
    return f"off-policy: no, tis_mode={stale.tis_mode} does not weight stale tokens"


if __name__ == "__main__":
    app()
