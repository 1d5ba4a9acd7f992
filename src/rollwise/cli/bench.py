"""``rollwise bench …``: the side-by-side benchmarks, one command each; every one takes ``--set
key=value`` for its settings and ``--json`` for its results (the tables are printed).

Each command is a row of ``BENCHES``: its module under ``rollwise.bench``, the function that runs
it (``overrides``, ``console`` and, for the long resumable ones, ``json_path`` to write as they go)
and its one-line help. The module is imported when the command runs, not when the CLI starts.
"""

from __future__ import annotations

import importlib

import typer

from rollwise.cli.common import JsonOpt, SetOpt, console, friendly_errors

bench_app = typer.Typer(no_args_is_help=True, help="Side-by-side benchmarks (ratios measured in one run).")

# command: (module, function, writes --json as it goes, help)
BENCHES: dict[str, tuple[str, str, bool, str]] = {
    "engine": ("engine", "run_engine_bench", False,
               "This engine vs HF `model.generate`, same model, prompts and sampling settings."),
    "precision": ("precision", "run_precision_bench", False,
                  "KL from fp32, top-1 agreement and tokens/s of bf16 and int8 schemes on this CPU (and the int8 "
                  "verdict)."),
    "rollout": ("rollout", "run_rollout_bench", False,
                "Rollout strategies side by side: tree/latr vs group (tokens per leaf, accuracy at equal tokens), "
                "april vs group."),
    "update": ("update", "run_update_bench", False,
               "The policy update with vs without skipping zero-advantage rows, same run side by side."),
    "trl": ("trl", "run_trl_bench", False,
            "rollwise vs TRL's GRPOTrainer: same warm start, data, reward and settings; s/step split, time to target "
            "accuracy."),
    "control": ("control", "run_control_bench", True,
                "Controllers vs the group baseline at an equal generated-token budget: accuracy, tokens to the "
                "baseline's accuracy."),
    "async": ("async_mode", "run_async_bench", True,
              "Sync vs async (max_staleness 1, 2) and replay vs none: wall time, accuracy at equal steps and wall, "
              "staleness."),
    "ablate": ("ablate", "run_ablate_bench", True,
               "The ablation ledger: every method id vs the grpo/group baseline at an equal token budget "
               "(resumable)."),
    "power": ("power", "run_power_bench", False,
              "Seeds and eval prompts a ledger needs to detect an effect, from a pilot ledger's noise floor (no "
              "training)."),
    "dist": ("dist", "run_dist_bench", False,
             "Rollout throughput with 1 and 2 Ray workers vs the in-process engine; weight-sync time per version."),
    "sandbox": ("sandbox", "run_sandbox_bench", False,
                "Executions/s of a trivial program: the sandbox pool vs one `subprocess.run` per job."),
    "multiturn": ("multiturn", "run_multiturn_bench", False,
                  "Multi-turn episodes: prefill tokens and episodes/s with the KV kept across turns vs re-prefilled "
                  "each turn."),
    "serve": ("serve", "run_serve_bench", False,
              "The OpenAI-compatible endpoint vs the in-process engine on the same requests at 1, 8, 32 in flight: "
              "req/s, tok/s."),
}


def _register(name: str, module: str, function: str, writes_as_it_goes: bool, help_text: str) -> None:
    @bench_app.command(name, help=help_text)
    @friendly_errors
    def command(json_path: JsonOpt = None, set_: SetOpt = None):
        from rollwise.bench.harness import write_json

        run = getattr(importlib.import_module(f"rollwise.bench.{module}"), function)
        extra = {"json_path": json_path} if writes_as_it_goes else {}
        write_json(json_path, run(overrides=set_ or [], console=console, **extra))

    command.__name__ = f"bench_{name}"


for _name, _row in BENCHES.items():
    _register(_name, *_row)
