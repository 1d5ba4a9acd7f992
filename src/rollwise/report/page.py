"""The report as one HTML page a person reads top down: the headline (before → after, cost), the
config, the key curves (the rest collapsed), training rollouts, eval samples by prompt, the tree.

Everything from a run is escaped (completions are model output); the page loads nothing and runs
no script: plots are data URIs, the style is inline, collapsed parts are ``<details>``.
"""

from __future__ import annotations

import json

import yaml

from rollwise.report.curves import TITLES, CurvePlan, key_rank, plan_curves
from rollwise.report.html import esc, pct, run_label
from rollwise.report.plots import Figure, render_curves
from rollwise.report.rollouts import eval_samples_section, training_rollouts_section
from rollwise.report.runs import MISSING, Run, config_diff, flatten
from rollwise.report.trees import trees_section

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1240px; color: #1d1d1f; }
h1 { font-size: 22px; } h2 { font-size: 18px; border-bottom: 1px solid #ddd; padding-bottom: 4px; margin-top: 28px; }
table { border-collapse: collapse; margin: 8px 0; } td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: left;
  vertical-align: top; }
th { background: #f4f4f6; } figure { margin: 6px 0; } img { width: 100%; } figcaption { font-size: 12px; }
.grid { display: grid; grid-template-columns: repeat(3, 1fr); gap: 4px 16px; }
.headline { font-size: 17px; margin: 6px 0; } .note { color: #8a4b00; }
.swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 4px; }
details { margin: 6px 0; } summary { cursor: pointer; } details > summary { font-weight: 500; }
.sample { border-left: 5px solid #c62828; padding: 2px 8px; margin: 6px 0; }
.sample.correct { border-left-color: #2e7d32; }
.group { border: 1px solid #ddd; border-radius: 4px; padding: 6px 10px; margin: 8px 0; }
table.rollouts { width: 100%; font-size: 13px; } table.rollouts td:last-child { width: 55%; }
tr.rollout.correct td:first-child { border-left: 4px solid #2e7d32; } tr.rollout.wrong td:first-child { border-left:
  4px solid #c62828; }
pre { white-space: pre-wrap; word-break: break-word; margin: 2px 0; background: #f7f7f9; padding: 3px 6px; }
.mark.correct, .leaf.correct > .mark { color: #2e7d32; font-weight: 600; }
.mark.wrong, .leaf.wrong > .mark { color: #c62828; font-weight: 600; }
.tree ul { list-style: none; padding-left: 22px; border-left: 1px dashed #bbb; margin: 2px 0; }
.tree code { background: #eef3fb; padding: 1px 4px; white-space: pre-wrap; }
.meta { color: #666; font-size: 12px; }
.turn { margin: 4px 0 4px 12px; } .turn .role { color: #666; font-size: 12px; }
.turn.tool pre { background: #eef7ee; } .turn.assistant pre { background: #f7f7f9; }
.turn.user pre { background: #f1f1f4; } .turn.error pre { background: #fdecea; } .turn.error .role { color: #c62828; }
.turn.final .role { color: #1d1d1f; font-weight: 600; } mark.call { background: #e3ecfa; color: #0b3d91; }
"""


def _cost(h: dict) -> str:
    wall = h.get("wall_seconds")
    parts = [f"{h.get('steps', MISSING)} RL steps", f"{h.get('generated_tokens', 0) or 0:,} generated tokens",
             f"{wall / 60:.1f} min RL wall time" if isinstance(wall, (int, float)) else None,
             _cpu(h.get("cpu"))]
    return " · ".join(p for p in parts if p)


def _cpu(cpu) -> str | None:
    """The machine as ``summary.json`` records it (``rollwise.hardware.cpu_record``: a dict), or None."""
    if isinstance(cpu, dict):
        cores = f", {cpu['cores']} cores" if cpu.get("cores") else ""
        return f"CPU: {cpu.get('model', '?')}{cores}"
    return f"CPU: {cpu}" if cpu else None


def _notes(run: Run) -> list[str]:
    """What a reader must not miss: failing reward functions, steps that had nothing to train on."""
    notes = [f"reward function <code>{esc(fn)}</code> failed on {n:,} completions (errors or non-finite values, "
             f"scored 0)" for fn, n in run.reward_failures().items()]
    share = run.zero_signal_share()
    if share is not None and share >= 0.5:
        notes.append(f"{share:.0%} of groups had no reward spread (all rollouts scored the same): their advantages "
                     "are 0 and nothing trained on them")
    return notes


def summary_section(runs: list[Run]) -> str:
    rows, lines = [], []
    for i, run in enumerate(runs):
        h = run.headline()
        method = " + ".join(str(h[k]) for k in ("method", "control", "replay", "mode") if h.get(k))
        before, after = h.get("initial_accuracy"), h.get("final_accuracy")
        gain = (f" ({(after - before) * 100:+.1f} points)" if isinstance(before, (int, float))
                and isinstance(after, (int, float)) else "")
        notes = "".join(f"<li class=\"note\">{n}</li>" for n in _notes(run))
        lines.append(f"<div class=\"run-headline\" data-run=\"{esc(run.name)}\"><p class=\"headline\">"
                     f"{run_label(i, run)}"
                     f": eval accuracy <b class=\"accuracy\">{pct(before)} → {pct(after)}</b>{gain}</p>"
                     f"<p class=\"cost meta\">{esc(str(h.get('task')))} · {esc(method)} · {esc(_cost(h))}</p>"
                     + (f"<ul>{notes}</ul>" if notes else "") + "</div>")
        rows.append(
            f"<tr data-run=\"{esc(run.name)}\"><td>{run_label(i, run)}</td><td>{esc(str(h.get('task')))}</td>"
            f"<td>{esc(method)}</td><td>{esc(str(h.get('steps')))}</td>"
            f"<td class=\"accuracy\">{pct(before)} → {pct(after)}</td><td>{esc(_cost(h))}</td>"
            f"<td>{esc(str(run.path))}</td></tr>")
    table = ("<details><summary>as a table, with the run directories</summary><table><tr><th>run</th><th>task</th>"
             "<th>method</th><th>steps</th><th>eval accuracy, initial → final</th><th>cost</th>"
             "<th>directory</th></tr>"
             + "".join(rows) + "</table></details>")
    return "<section id=\"summary\"><h2>Result</h2>" + "".join(lines) + table + "</section>"


def config_section(runs: list[Run]) -> str:
    if len(runs) == 1:
        text = yaml.safe_dump(runs[0].config, sort_keys=False) if runs[0].config else "(no config.yaml)"
        return (f"<section id=\"config\"><h2>Config</h2><details><summary>config.yaml ({len(flatten(runs[0].config))} "
                f"settings, as resolved)</summary><pre class=\"config\">{esc(text)}</pre></details></section>")
    diff = config_diff([r.config for r in runs])
    head = "<tr><th>key</th>" + "".join(f"<th>{run_label(i, r)}</th>" for i, r in enumerate(runs)) + "</tr>"
    rows = "".join(f"<tr data-key=\"{esc(k)}\"><td><code>{esc(k)}</code></td>"
                   + "".join(f"<td>{esc(v if isinstance(v, str) else json.dumps(v))}</td>" for v in vals) + "</tr>"
                   for k, vals in diff.items())
    note = f"{len(diff)} keys differ" if diff else "the configs are equal"
    return (f"<section id=\"config\"><h2>Config diff</h2><p class=\"meta\">{note} (config.yaml, flattened)</p>"
            f"<table class=\"config-diff\">{head}{rows}</table></section>")


def _figures(figures: list[Figure], grid: bool) -> str:
    body = "".join(
        f"<figure id=\"{f.id}\" data-metrics=\"{esc(' '.join(f.metrics))}\"><figcaption><b>{esc(f.title)}</b>"
        f"</figcaption><img alt=\"{esc(f.title)}\" src=\"data:image/png;base64,{f.png}\"></figure>" for f in figures)
    return f"<div class=\"grid\">{body}</div>" if grid else body


def curves_section(runs: list[Run], plan: CurvePlan | None = None) -> str:
    """Key curves open; for one run over steps (tokens and wall time collapsed), for several over all three."""
    plan = plan or plan_curves(runs)
    one = len(runs) == 1
    axes = ["step"] if one else ["step", "tokens", "wall"]
    parts = [_figures(render_curves(runs, plan.key, axes, "curve-key"), grid=one)]
    if one and plan.key:
        parts.append("<details id=\"curves-axes\"><summary>the same over generated tokens and RL wall time</summary>"
                     + _figures(render_curves(runs, plan.key, ["tokens", "wall"], "curve-axes"), grid=False)
                     + "</details>")
    for gid, curves in plan.more.items():
        parts.append(f"<details class=\"more-curves\" id=\"curves-{gid}\"><summary>{esc(TITLES[gid])} ({len(curves)})"
                     f"</summary>{_figures(render_curves(runs, curves, axes, f'curve-{gid}'), grid=one)}</details>")
    key_flat = [f"{esc(' = '.join(names))} {value:g}" for names, value in plan.flat if key_rank(names[0]) is not None]
    if key_flat:  # a key curve that never moved is news (an all-zero reward): said, not only folded
        parts.insert(0, "<p class=\"flat-key\">One value throughout, not plotted: " + " · ".join(key_flat) + "</p>")
    if plan.flat:
        rows = "".join(f"<tr data-metrics=\"{esc(' '.join(names))}\"><td>{esc(', '.join(names))}</td>"
                       f"<td>{value:g}</td></tr>" for names, value in plan.flat)
        n = sum(len(names) for names, _ in plan.flat)
        parts.append(f"<details id=\"curves-flat\"><summary>{n} more metrics, flat (one value throughout)</summary>"
                     f"<table><tr><th>metrics</th><th>value</th></tr>{rows}</table></details>")
    smooth = "long series smoothed (moving average, raw values faint); " if any(
        len(r.metrics) >= 20 for r in runs) else ""
    return ("<section id=\"curves\"><h2>Curves</h2><p class=\"meta\">The curves that matter first; series equal to "
            f"each other are one plot titled with every name; {smooth}the rest below, collapsed.</p>"
            + "".join(parts) + "</section>")


def render_page(runs: list[Run]) -> str:
    title = "rollwise report: " + ", ".join(r.name for r in runs)
    body = "".join([summary_section(runs), config_section(runs), curves_section(runs), training_rollouts_section(runs),
                    eval_samples_section(runs), trees_section(runs)])
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{esc(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{esc(title)}</h1>{body}</body></html>\n")
