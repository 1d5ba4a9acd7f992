"""``rollwise bench …``: the side-by-side benchmarks, one command each; every one takes ``--set
key=value`` for its settings and ``--json`` for its results (the tables are printed)."""

from __future__ import annotations

from pathlib import Path

import typer

from rollwise.cli.common import JsonOpt, SetOpt, console, friendly_errors

bench_app = typer.Typer(no_args_is_help=True, help="Side-by-side benchmarks (ratios measured in one run).")


def _report(results: dict, json_path: Path | None) -> None:
    """A benchmark's results to ``--json`` (its tables are already printed)."""
    from rollwise.bench.harness import write_json

    write_json(json_path, results)


@bench_app.command("engine")
@friendly_errors
def bench_engine(json_path: JsonOpt = None, set_: SetOpt = None):
    """This engine vs HF `model.generate`, same model, prompts and sampling settings."""
    from rollwise.bench.engine import run_engine_bench

    _report(run_engine_bench(overrides=set_ or [], console=console), json_path)


@bench_app.command("precision")
@friendly_errors
def bench_precision(json_path: JsonOpt = None, set_: SetOpt = None):
    """KL from fp32, top-1 agreement and tokens/s of bf16 and int8 schemes on this CPU (and the int8 verdict)."""
    from rollwise.bench.precision import run_precision_bench

    _report(run_precision_bench(overrides=set_ or [], console=console), json_path)


@bench_app.command("rollout")
@friendly_errors
def bench_rollout(json_path: JsonOpt = None, set_: SetOpt = None):
    """Rollout strategies side by side: tree/latr vs group (tokens per leaf, accuracy at equal tokens), april vs group."""
    from rollwise.bench.rollout import run_rollout_bench

    _report(run_rollout_bench(overrides=set_ or [], console=console), json_path)


@bench_app.command("update")
@friendly_errors
def bench_update(json_path: JsonOpt = None, set_: SetOpt = None):
    """The policy update with vs without skipping zero-advantage rows, same run side by side."""
    from rollwise.bench.update import run_update_bench

    _report(run_update_bench(overrides=set_ or [], console=console), json_path)


@bench_app.command("trl")
@friendly_errors
def bench_trl(json_path: JsonOpt = None, set_: SetOpt = None):
    """rollwise vs TRL's GRPOTrainer: same warm start, data, reward and settings; s/step split, time to target accuracy."""
    from rollwise.bench.trl import run_trl_bench

    _report(run_trl_bench(overrides=set_ or [], console=console), json_path)


@bench_app.command("control")
@friendly_errors
def bench_control(json_path: JsonOpt = None, set_: SetOpt = None):
    """Controllers vs the group baseline at an equal generated-token budget: accuracy, tokens to the baseline's accuracy."""
    from rollwise.bench.control import run_control_bench

    _report(run_control_bench(overrides=set_ or [], console=console, json_path=json_path), json_path)


@bench_app.command("async")
@friendly_errors
def bench_async(json_path: JsonOpt = None, set_: SetOpt = None):
    """Sync vs async (max_staleness 1, 2) and replay vs none: wall time, accuracy at equal steps and wall, staleness."""
    from rollwise.bench.async_mode import run_async_bench

    _report(run_async_bench(overrides=set_ or [], console=console, json_path=json_path), json_path)


@bench_app.command("ablate")
@friendly_errors
def bench_ablate(json_path: JsonOpt = None, set_: SetOpt = None):
    """The ablation ledger: every method id vs the grpo/group baseline at an equal token budget (resumable)."""
    from rollwise.bench.ablate import run_ablate_bench

    run_ablate_bench(overrides=set_ or [], console=console, json_path=json_path)


@bench_app.command("power")
@friendly_errors
def bench_power(json_path: JsonOpt = None, set_: SetOpt = None):
    """Seeds and eval prompts a ledger needs to detect an effect, from a pilot ledger's noise floor (no training)."""
    from rollwise.bench.power import run_power_bench

    _report(run_power_bench(overrides=set_ or [], console=console), json_path)


@bench_app.command("dist")
@friendly_errors
def bench_dist(json_path: JsonOpt = None, set_: SetOpt = None):
    """Rollout throughput with 1 and 2 Ray workers vs the in-process engine; weight-sync time per version."""
    from rollwise.bench.dist import run_dist_bench

    _report(run_dist_bench(overrides=set_ or [], console=console), json_path)


@bench_app.command("sandbox")
@friendly_errors
def bench_sandbox(json_path: JsonOpt = None, set_: SetOpt = None):
    """Executions/s of a trivial program: the sandbox pool vs one `subprocess.run` per job."""
    from rollwise.bench.sandbox import run_sandbox_bench

    _report(run_sandbox_bench(overrides=set_ or [], console=console), json_path)


@bench_app.command("multiturn")
@friendly_errors
def bench_multiturn(json_path: JsonOpt = None, set_: SetOpt = None):
    """Multi-turn episodes: prefill tokens and episodes/s with the KV kept across turns vs re-prefilled each turn."""
    from rollwise.bench.multiturn import run_multiturn_bench

    _report(run_multiturn_bench(overrides=set_ or [], console=console), json_path)


@bench_app.command("serve")
@friendly_errors
def bench_serve(json_path: JsonOpt = None, set_: SetOpt = None):
    """The OpenAI-compatible endpoint vs the in-process engine on the same requests at 1, 8, 32 in flight: req/s, tok/s."""
    from rollwise.bench.serve import run_serve_bench

    _report(run_serve_bench(overrides=set_ or [], console=console), json_path)
