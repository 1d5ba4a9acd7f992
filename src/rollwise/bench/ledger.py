"""The ablation ledger's pages: ``ledger.md`` and ``ledger.html`` from ``bench ablate``'s summary.

One table per task and regime (the ledger's own setting first, then each off-policy regime
against its own baseline); the noise-floor row's verdict is repeated above the tables, since
the rule is only as good as that row.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

RULE = ("Δ: the arm's greedy accuracy minus its baseline's, in points, paired by seed and by prompt (the same "
        "eval prompts on a seed); [95% CI]: the paired t interval over seeds (rollwise.bench.stats); verdict "
        "\"better\"/\"worse\" only when it excludes 0 (p < 0.05), else \"no detectable difference\". n: seeds × "
        "prompts per seed. Departs at step: the first step at which the arm's runs sampled other tokens or "
        "rewards than the baseline's on the same seed (earliest over seeds; \"never\": identical for the whole "
        "budget — the method had no occasion to act). Tokens to baseline's final: the generated tokens at the arm's "
        "first eval at or above the baseline's final accuracy over the baseline's own, mean over the seeds that "
        "reached it (reached/seeds) [95% t interval over those seeds]. Zero-signal groups: the share of trained "
        "groups whose rewards did not spread (nothing trains on them), mean over the arm's runs. Ids joined by ≡: runs identical on every seed, one "
        "computation at these settings, reported once. The noise floor is the baseline again with other "
        "sampling seeds: it reads \"no detectable difference\" in 95% of ledgers; when it does not, distrust "
        "the verdicts. p (Holm): the arm's p adjusted over the table's method arms (Holm 1979): below 0.05, the "
        "verdict holds family-wise; a \"better\" whose Holm p is not may be the table's chance win.")
COLUMNS = ("arm", "config line", "accuracy", "Δ vs baseline [95% CI]", "p", "n", "departs at step",
           "tokens to baseline's final", "zero-signal groups", "wall s", "verdict")


def regime_of(arm: str) -> str | None:
    return arm.partition("@")[2] or None


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
    ratio = "—" if row["tokens_ratio"] is None else f"{row['tokens_ratio']:.2f}× ({row['reached']}/{row['seeds']})"
    if row.get("tokens_ratio_ci95"):
        lo, hi = row["tokens_ratio_ci95"]
        ratio += f" [{lo:.2f}, {hi:.2f}]"
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
        out.setdefault(regime_of(arm), []).append((arm, row))
    return sorted(out.items(), key=lambda kv: kv[0] is not None)


def noise_line(table: dict[str, dict]) -> str | None:
    row = table.get("noise_floor")
    if row is None or "difference" not in row:
        return None
    return f"Noise floor (the baseline with other sampling seeds): {delta(row)}, {row['verdict']}."


def progress_line(progress: dict) -> str:
    """"Runs: 13 of 60 finished; begun: control:vade seed 1 (step 40, 21,400 of 40,000 tokens)"."""
    line = f"Runs: {progress['finished']} of {progress['planned']} finished"
    if progress["begun"]:
        line += "; begun: " + ", ".join(f"{r['arm']} seed {r['seed']} (step {r['step']}, {r['tokens']:,} of "
                                        f"{r['budget']:,} tokens)" for r in progress["begun"])
    return line + "."


def to_markdown(ledger: dict) -> str:
    lines = [f"Command: `{ledger['command']}`", ""]
    if ledger.get("progress"):  # a ledger of older runs has none
        lines += [progress_line(ledger["progress"]), ""]
    lines += [RULE, ""]
    for task, table in ledger["tasks"].items():
        lines += [f"### {task}", ""]
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
    return "\n".join(lines)


def to_html(ledger: dict) -> str:
    parts = []
    for task, table in ledger["tasks"].items():
        parts.append(f"<h2>{html.escape(task)}</h2>")
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
    return ("<!doctype html><html><head><meta charset='utf-8'><title>rollwise ablation ledger</title><style>"
            "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
            "padding:4px 8px}</style></head><body><h1>Ablation ledger</h1><p>" + html.escape(ledger["command"])
            + "</p>" + (f"<p>{html.escape(progress_line(ledger['progress']))}</p>" if ledger.get("progress") else "")
            + "<p>" + html.escape(RULE) + "</p>" + "".join(parts) + "</body></html>")


def write_ledger(ledger: dict, out: Path) -> str:
    """Write ``ledger.json``, ``ledger.md`` and ``ledger.html`` into ``out``; returns the markdown."""
    (out / "ledger.json").write_text(json.dumps(ledger, indent=2))
    md = to_markdown(ledger)
    (out / "ledger.md").write_text(md + "\n")
    (out / "ledger.html").write_text(to_html(ledger))
    return md
