"""The ablation ledger: ``bench ablate``'s runs summarized per arm, and its pages.

``summarize``, per arm and task: accuracy at the budget (mean over seeds); the effect against its
baseline, paired by seed and prompt, with its 95% t interval over seeds, p and verdict
(``rollwise.bench.stats``), and its p adjusted over its regime's method arms (Holm); the first step
at which its runs depart from the baseline's (``departs_at``: earliest over seeds; None = identical
for the whole budget); generated tokens to the baseline's final accuracy, with its interval; the
accuracy curve over generated tokens (``mean_curve``); the share of trained groups without reward
spread; what its controller did (``control/*``, mean per step); wall time. ``machines``: where and in
which precision the task's runs computed (a ledger that mixes machines says so above its tables). Arms whose runs are
identical on every seed — per-step trace and every eval's per-prompt correctness — are one
computation at these settings and are reported once, with every id (``ids``).

The pages: one table per task and regime (the ledger's own setting first, then each off-policy
regime against its own baseline); the noise-floor row's verdict is repeated above the tables, since
the rule is only as good as that row; ``curves.png`` draws each method's arms' curves.
"""

from __future__ import annotations

import html
import json
import math
import statistics
from collections import Counter
from pathlib import Path

import numpy as np

from rollwise.bench.arms import BASELINE, arm_lines, baseline_of, split_arm
from rollwise.bench.compare import departs_at, metric_means, paired, ratio_cell, tokens_ratio_fields
from rollwise.bench.harness import NOISE_FLOOR
from rollwise.bench.reading import method_arms, reading_lines
from rollwise.bench.stats import add_holm, identical_groups, seed_test, verdict

RULE = ("Δ: the arm's greedy accuracy minus its baseline's, in points, paired by seed and by prompt (the same "
        "eval prompts on a seed); [95% CI]: the paired t interval over seeds (rollwise.bench.stats); verdict "
        "\"better\"/\"worse\" only when it excludes 0 (p < 0.05), else \"no detectable difference\". n: seeds × "
        "prompts per seed. Departs at step: the first step at which the arm's runs sampled other tokens or "
        "rewards than the baseline's on the same seed (earliest over seeds; \"never\": identical for the whole "
        "budget — the method had no occasion to act). Tokens to baseline's final: the generated tokens at the arm's "
        "first eval at or above the baseline's final accuracy over the baseline's own, geometric mean over the "
        "seeds (reached/seeds) [95% t interval over seeds, on the log scale]; a seed that never reached it counts "
        "at its last eval's tokens, a lower bound, and the cell reads \"≥\". "
        "Zero-signal groups: the share of trained groups whose rewards did not spread (nothing trains on "
        "them), mean over the arm's runs. Ids joined by ≡: runs identical on every seed, one "
        "computation at these settings, reported once. The noise floor is the baseline again with other "
        "sampling seeds: it reads \"no detectable difference\" in 95% of ledgers; when it does not, distrust "
        "the verdicts. p (Holm): the arm's p adjusted over the table's method arms (Holm 1979): below 0.05, the "
        "verdict holds family-wise; a \"better\" whose Holm p is not may be the table's chance win.")
COLUMNS = ("arm", "config line", "accuracy", "Δ vs baseline [95% CI]", "p", "n", "departs at step",
           "tokens to baseline's final", "zero-signal groups", "wall s", "verdict")


# -- the summary ---------------------------------------------------------------------------
def _effect(rs: dict[int, dict], base: dict[int, dict], seeds: list[int]) -> dict:
    """The paired effect on per-prompt correctness (records of an older ablation without it: on the
    per-seed accuracies alone, the same t rule)."""
    if effect := paired({s: rs[s] for s in seeds}, base, lambda r: r.get("correct")):
        return effect | {"seeds": len(seeds)}
    diffs = [rs[s]["final_accuracy"] - base[s]["final_accuracy"] for s in seeds]
    mean, ci, p = seed_test(diffs)
    return {"difference": mean, "ci95": None if ci is None else list(ci), "p": p, "seed_differences": diffs,
            "seeds": len(seeds), "pairs": None, "prompt_se": None, "verdict": verdict(ci, p)}


def _mean(values: list[float | None]) -> float | None:
    """The mean over the runs that recorded the value (None: none did)."""
    kept = [v for v in values if v is not None]
    return statistics.mean(kept) if kept else None


def _fingerprint(record: dict) -> str | None:
    """What makes two runs the same computation: every step's trace and every eval's correctness per prompt."""
    if "trace" not in record:
        return None
    return json.dumps([record["trace"], record["eval_correct"]])


def summarize(runs: list[dict], arms: list[str]) -> dict[str, dict]:
    """Per arm: accuracy at the budget; the paired effect against its baseline (``rollwise.bench.stats``);
    the first step its runs depart from the baseline's; tokens to the baseline's final accuracy; wall
    time (or the refusal). Arms identical on every seed share one row, keyed by the first, with ``ids``."""
    by_arm: dict[str, dict[int, dict]] = {}
    for r in runs:
        by_arm.setdefault(r["arm"], {})[r["seed"]] = r
    table = {}
    for arm in arms:
        rs = by_arm.get(arm, {})
        if not rs:
            continue
        refused = next((r["refused"] for r in rs.values() if "refused" in r), None)
        if refused is not None:
            table[arm] = {"ids": [arm], "lines": arm_lines(arm), "refused": refused}
            continue
        base = {s: r for s, r in by_arm.get(baseline_of(arm), {}).items() if "refused" not in r}
        seeds = sorted(s for s in rs if s in base)
        curves = [r["curve"] for r in rs.values() if r.get("curve")]
        row = {"ids": [arm], "lines": arm_lines(arm), "seeds": len(rs),
               "accuracies": [rs[s]["final_accuracy"] for s in sorted(rs)],
               "accuracy_mean": statistics.mean(rs[s]["final_accuracy"] for s in rs),
               "steps_mean": statistics.mean(r.get("steps", 0) for r in rs.values()),
               "wall_seconds": statistics.mean(r["wall_seconds"] for r in rs.values()),
               # geometric; a seed that never reached the baseline's final accuracy counts at its lower bound
               **tokens_ratio_fields(rs, base),
               "curve": mean_curve(curves) if curves else None,  # accuracy over generated tokens, mean over seeds
               "zero_signal_share": _mean([r.get("zero_signal_share") for r in rs.values()]),
               "control": metric_means([r.get("control", {}) for r in rs.values()]),  # mean of the runs' means
               "departs_at": departs_at(rs, base)}
        if seeds and arm != baseline_of(arm):
            row |= _effect(rs, base, seeds)
        elif seeds:
            row |= {"difference": 0.0, "verdict": "baseline"}
        table[arm] = row
    return _with_holm(_merge_identical(table, by_arm))


def _with_holm(table: dict[str, dict]) -> dict[str, dict]:
    """Each method arm's Holm-adjusted p (``p_holm``) over the arms of its regime: the baseline and the
    noise floor (the rule's own check) are not in the family."""
    for regime in dict.fromkeys(split_arm(arm)[1] for arm in table):
        add_holm(table, method_arms({arm: row for arm, row in table.items() if split_arm(arm)[1] == regime}))
    return table


def _merge_identical(table: dict[str, dict], by_arm: dict[str, dict[int, dict]]) -> dict[str, dict]:
    """One row per group of arms of one regime whose runs are identical on every seed, kept under the
    regime's baseline (an arm identical to the baseline is the baseline) or else its first arm,
    listing every id."""
    prints = {arm: {s: _fingerprint(r) for s, r in by_arm[arm].items()} for arm, row in table.items()
              if "refused" not in row and all(_fingerprint(r) is not None for r in by_arm[arm].values())}
    regimes = dict.fromkeys(split_arm(arm)[1] for arm in prints)
    merged = dict(table)
    for group in (g for r in regimes for g in identical_groups({a: p for a, p in prints.items()
                                                                if split_arm(a)[1] == r})):
        if len(group) < 2:
            continue
        keep = next((a for a in group if a == baseline_of(a)), group[0])  # a baseline keeps its row
        ids = [keep, *(a for a in group if a != keep)]
        merged[keep] = table[keep] | {"ids": ids, "lines": list(dict.fromkeys(x for a in ids for x in arm_lines(a)))}
        for arm in group:
            if arm != keep:
                del merged[arm]
    return merged


def mean_curve(curves: list[list], points: int = 21) -> list[list[float]]:
    """The seeds' accuracy curves (``[generated tokens, accuracy]`` at each eval), each linearly
    interpolated between its evals and averaged on a common grid of ``points`` token counts, from 0 to
    the shortest run's last eval.

    >>> mean_curve([[[0, .2], [100, .4]], [[0, .4], [50, .5], [120, .5]]], points=3)
    [[0.0, 0.3], [50.0, 0.4], [100.0, 0.45]]
    """
    end = min(c[-1][0] for c in curves)
    grid = np.linspace(0, end, points)
    ys = np.mean([np.interp(grid, [t for t, _ in c], [a for _, a in c]) for c in curves], axis=0)
    return [[round(float(x), 6), round(float(y), 6)] for x, y in zip(grid, ys)]


# -- the pages -----------------------------------------------------------------------------
def delta(row: dict) -> str:
    """Δ vs the baseline in points with its interval, as the ledgers print it."""
    if row.get("verdict") == "baseline":
        return "—"
    if "difference" not in row:
        return "—"
    if row.get("ci95") is None:
        return f"{row['difference'] * 100:+.1f} [—]"
    lo, hi = row["ci95"]
    return f"{row['difference'] * 100:+.1f} [{lo * 100:+.1f}, {hi * 100:+.1f}]"


def _p(p: float) -> str:
    return f"{p:.3f}" if p >= 0.001 else "<0.001"


def verdict_cell(row: dict) -> str:
    """The verdict, with its Holm-adjusted p when it is one ("better (Holm p 0.220)"): the benches' tables."""
    v = row.get("verdict", "—")
    return f"{v} (Holm p {_p(row['p_holm'])})" if v in ("better", "worse") and row.get("p_holm") is not None else v


def cells(arm: str, row: dict) -> list[str]:
    ids = " ≡ ".join(row.get("ids", [arm]))
    line = ", ".join(f"`{x}`" for x in row["lines"]) or "—"
    if "refused" in row:
        return [ids, line, *["—"] * 8, f"refused: {row['refused']}"]
    ratio = ratio_cell(row)
    p = "—" if row.get("p") is None else _p(row["p"])
    if row.get("p_holm") is not None:
        p += f" (Holm {_p(row['p_holm'])})"
    n = "—" if not row.get("pairs") else f"{row['seeds']}×{row['pairs'] // row['seeds']}"
    baseline = row.get("verdict") == "baseline"
    departs = "—" if baseline and len(row.get("ids", [])) < 2 else (
        "never" if row.get("departs_at") is None else str(row["departs_at"]))
    zero = "—" if row.get("zero_signal_share") is None else f"{row['zero_signal_share']:.0%}"
    return [ids, line, f"{row['accuracy_mean']:.1%}", delta(row), p, n, departs, ratio, zero,
            f"{row['wall_seconds']:.0f}", row.get("verdict", "—")]


def control_line(row: dict) -> str:
    """What the arm's controller did, mean per step ("refill_rounds 2, kept_groups 15.9"; "" for none)."""
    return ", ".join(f"{k.split('/', 1)[1]} {v:.3g}" for k, v in row.get("control", {}).items())


def sections(table: dict[str, dict]) -> list[tuple[str | None, list[tuple[str, dict]]]]:
    """The rows of one task grouped by regime (the ledger's setting first), in table order."""
    out: dict[str | None, list] = {}
    for arm, row in table.items():
        out.setdefault(split_arm(arm)[1], []).append((arm, row))
    return sorted(out.items(), key=lambda kv: kv[0] is not None)


def machines(records: list[dict]) -> dict[str, int]:
    """How many of a task's runs computed where and in which precision (``harness.computed_on``;
    "unrecorded": runs that did not say), and from which starting weights (``start``, when recorded),
    most runs first.

    >>> machines([{"computed_on": "A"}, {"computed_on": "B"}, {"computed_on": "A"}, {"refused": "x"}])
    {'A': 2, 'B': 1}
    >>> machines([{"computed_on": "A", "start": "3fa2"}, {"computed_on": "A", "start": "b7c0"}])
    {'A, from weights 3fa2': 1, 'A, from weights b7c0': 1}
    """
    return dict(Counter((r.get("computed_on") or "unrecorded") + (f", from weights {r['start']}" if r.get("start")
                                                                  else "")
                        for r in records if "refused" not in r).most_common())


def machines_line(counts: dict[str, int]) -> str | None:
    """"Computed on: AMD EPYC (AVX2), sampling float32, update float32 — all 19 runs." or, when the runs
    differ, a warning naming each (None: no runs)."""
    if not counts:
        return None
    if len(counts) == 1:
        (where, n), = counts.items()
        return f"Computed on: {where} — all {n} run{'s' if n > 1 else ''}."
    return ("Computed on more than one machine or precision, or from other starting weights — the rows mix "
            "computations; a difference may be the machine's: "
            + "; ".join(f"{where}: {n} run{'s' if n > 1 else ''}" for where, n in counts.items())
            + ".")


def noise_line(table: dict[str, dict]) -> str | None:
    row = table.get("noise_floor")
    if row is None or "difference" not in row:
        return None
    return f"Noise floor (the baseline with other sampling seeds): {delta(row)}, {row['verdict']}."


def progress_line(progress: dict) -> str:
    """"Runs: 13 of 60 finished; begun: control:vade seed 1 (step 40, 21,400 of 40,000 tokens)." and, with
    the finished runs' mean RL wall time, what is left in run-hours (an estimate: their load is in it, their
    model load and first and last eval are not).

    >>> progress_line({"finished": 2, "planned": 6, "begun": [], "mean_run_seconds": 2700.0})
    'Runs: 2 of 6 finished. Left: 4 runs, ~3.0 run-hours (a finished run took 45 minutes of RL steps on average).'
    """
    line = f"Runs: {progress['finished']} of {progress['planned']} finished"
    if progress["begun"]:
        line += "; begun: " + ", ".join(f"{r['arm']} seed {r['seed']} (step {r['step']}, {r['tokens']:,} of "
                                        f"{r['budget']:,} tokens)" for r in progress["begun"])
    left, mean = progress["planned"] - progress["finished"], progress.get("mean_run_seconds")
    if left and mean:
        line += (f". Left: {left} run{'s' if left > 1 else ''}, ~{left * mean / 3600:.1f} run-hours (a finished run "
                 f"took {mean / 60:.0f} minutes of RL steps on average)")
    return line + "."


def _reading(ledger: dict, task: str, regime: str | None) -> dict | None:
    """The reading of one task's regime table (``bench ablate`` keys the ledger's setting as "")."""
    return ledger.get("reading", {}).get(task, {}).get(regime or "")


def to_markdown(ledger: dict) -> str:
    lines = [f"Command: `{ledger['command']}`", ""]
    if ledger.get("progress"):  # a ledger of older runs has none
        lines += [progress_line(ledger["progress"]), ""]
    lines += [RULE, ""]
    for task, table in ledger["tasks"].items():
        lines += [f"### {task}", ""]
        if (where := machines_line(ledger.get("computed_on", {}).get(task, {}))) is not None:
            lines += [where, ""]
        if (noise := noise_line(table)) is not None:
            lines += [noise, ""]
        for regime, rows in sections(table):
            if regime is not None:
                lines += [f"#### {task}, off-policy regime `{regime}` (Δ against `baseline@{regime}`)", ""]
            lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
            lines += ["| " + " | ".join(cells(arm, row)) + " |" for arm, row in rows]
            lines.append("")
            lines += [f"- `{arm}`: {acted}" for arm, row in rows if (acted := control_line(row))]
            lines += [""] if any(control_line(row) for _, row in rows) else []
            if (reading := _reading(ledger, task, regime)) is not None:
                lines += [*reading_lines(reading), ""]
    return "\n".join(lines)


def to_html(ledger: dict) -> str:
    parts = []
    for task, table in ledger["tasks"].items():
        parts.append(f"<h2>{html.escape(task)}</h2>")
        if (where := machines_line(ledger.get("computed_on", {}).get(task, {}))) is not None:
            parts.append(f"<p>{html.escape(where)}</p>")
        if (noise := noise_line(table)) is not None:
            parts.append(f"<p>{html.escape(noise)}</p>")
        for regime, rows in sections(table):
            if regime is not None:
                parts.append(f"<h3>off-policy regime {html.escape(regime)}</h3>")
            parts.append("<table><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS) + "</tr>")
            for arm, row in rows:
                parts.append("<tr>" + "".join(f"<td>{html.escape(c.replace('`', ''))}</td>" for c in cells(arm, row))
                             + "</tr>")
            parts.append("</table>")
            if (reading := _reading(ledger, task, regime)) is not None:
                parts += [f"<p>{html.escape(line.replace('`', '').replace('**', ''))}</p>"
                          for line in reading_lines(reading)]
    return ("<!doctype html><html><head><meta charset='utf-8'><title>rollwise ablation ledger</title><style>"
            "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
            "padding:4px 8px}</style></head><body><h1>Ablation ledger</h1><p>" + html.escape(ledger["command"])
            + "</p>" + (f"<p>{html.escape(progress_line(ledger['progress']))}</p>" if ledger.get("progress") else "")
            + "<p>" + html.escape(RULE) + "</p>" + "".join(parts) + "</body></html>")


def plot_curves(ledger: dict, runs: dict[str, list[dict]], path: Path) -> bool:
    """``curves.png``: one panel per method (an arm's first id; a regime's arms apart), its arms' mean
    accuracy curves over generated tokens (``mean_curve``) against their baseline's and the noise
    floor's, every seed's own curve faint beneath (``runs``: records per task). False: no arm had a
    curve, nothing drawn."""
    from rollwise.report.html import COLOURS
    from rollwise.report.plots import _pyplot

    panels = []  # (task, title, the arms' baseline, the arms)
    for task, table in ledger["tasks"].items():
        groups: dict[tuple[str, str | None], list[str]] = {}
        for arm, row in table.items():
            body, regime = split_arm(arm)
            if row.get("curve") and body not in (BASELINE, NOISE_FLOOR):
                groups.setdefault((body.split("+")[0], regime), []).append(arm)
        panels += [(task, method + (f"@{regime}" if regime else ""), baseline_of(arms[0]), arms)
                   for (method, regime), arms in groups.items()]
    if not panels:
        return False
    plt = _pyplot()
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.8 * rows), squeeze=False, dpi=90, sharey=True)
    for ax, (task, title, base, arms) in zip(axes.flat, panels):
        table, records = ledger["tasks"][task], runs.get(task, [])
        lines = [(base, "black"), *([(NOISE_FLOOR, "grey")] if base == BASELINE else []),
                 *((arm, COLOURS[i % len(COLOURS)]) for i, arm in enumerate(arms))]
        for arm, colour in lines:
            if not table.get(arm, {}).get("curve"):
                continue
            for r in (r for r in records if r["arm"] == arm and r.get("curve")):
                ax.plot(*zip(*r["curve"]), "-", color=colour, alpha=0.15, linewidth=0.7)
            style = "--" if arm == NOISE_FLOOR else "-"
            ax.plot(*zip(*table[arm]["curve"]), style, color=colour, linewidth=1.6,
                    label=f"{arm} ({table[arm]['seeds']} seed{'s' if table[arm]['seeds'] > 1 else ''})")
        ax.set_title(f"{task}: {title}", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.set_xlabel("generated tokens", fontsize=7)
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(0, -0.16), frameon=False)  # below: never over a curve
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes[0][0].set_ylabel("greedy eval accuracy (mean over seeds)", fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def write_ledger(ledger: dict, out: Path, runs: dict[str, list[dict]] | None = None) -> str:
    """Write ``ledger.json``, ``ledger.md``, ``ledger.html`` and (with the ``runs``' records per task)
    ``curves.png`` into ``out``; returns the markdown."""
    (out / "ledger.json").write_text(json.dumps(ledger, indent=2))
    drawn = runs is not None and plot_curves(ledger, runs, out / "curves.png")
    md = to_markdown(ledger)
    if drawn:
        md += "\n![every arm's accuracy over generated tokens, against its baseline](curves.png)\n"
    (out / "ledger.md").write_text(md + "\n")
    (out / "ledger.html").write_text(to_html(ledger))
    return md
