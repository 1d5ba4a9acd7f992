"""The ledger's reading: what its rows allow one to claim, by a rule fixed before they are seen.

A ledger's table can be read too early (after a lucky seed) and too generously (the one "better"
among ten arms read one by one). So the reading is code, and it states nothing until every arm of
the table has ``look`` seeds (``bench ablate``'s ``look``, default: every seed planned): before,
it says how far the rows are from being read. Then, per table (one regime):

- an arm **beats** (or **loses to**) the baseline only when its paired verdict holds family-wise,
  its p adjusted over the table's method arms below 0.05 (Holm 1979); such an arm is a claim,
  with its difference and interval in points;
- an arm "better" or "worse" on its own p but not family-wise is listed as such and not claimed
  (the family's chance verdict);
- when no arm differs family-wise it says so, with the range the arms' intervals cover — the
  effects the ledger could not tell from none;
- the second number, generated tokens to the baseline's final accuracy: the arms whose interval
  (geometric mean over seeds, log-scale t interval) excludes 1× — a secondary measure, not
  adjusted over the family, so stated and not claimed. A seed on which the arm never reached that
  accuracy counts at its lower bound (its last eval's tokens over the baseline's), so "more" stays
  a safe reading and "fewer" is never read from an arm's lucky seeds: an arm with such a seed is
  not listed as needing fewer;
- the noise floor's own verdict first: when it is not "no detectable difference" the rule has
  failed its check and every verdict is in doubt.

The rule is the one docs/ledger.md fixed for the thesis test before its arms ran; every ledger
reads by it.
"""

from __future__ import annotations

from rollwise.bench.arms import baseline_of, split_arm
from rollwise.bench.compare import never_reached
from rollwise.bench.harness import NOISE_FLOOR
from rollwise.bench.stats import LEVEL, NO_DIFFERENCE

ALPHA = 1 - LEVEL


def _points(claim: dict) -> str:
    ci = claim.get("ci95")
    interval = f" [{ci[0] * 100:+.1f}, {ci[1] * 100:+.1f}]" if ci else ""
    return f"Δ {claim['difference'] * 100:+.1f}{interval} points"


def method_arms(rows: dict[str, dict]) -> list[str]:
    """A table's method arms: neither a baseline nor the noise floor."""
    return [arm for arm in rows if arm != baseline_of(arm) and split_arm(arm)[0] != NOISE_FLOOR]


def read_table(rows: dict[str, dict], look: int) -> dict:
    """The reading of one table (one regime's rows, keyed by arm): ``ready`` once every arm has ``look``
    seeds paired with the baseline, then ``claimed`` (family-wise better/worse), ``per_arm_only``,
    ``failed`` (refused arms), ``bounds`` (the lowest and highest interval ends of the arms without a
    family-wise verdict, in points), ``faster``/``slower`` (tokens-ratio intervals excluding 1),
    ``never_reached`` (per arm, seeds that never reached the baseline's final accuracy) and the
    noise floor's verdict."""
    arms = method_arms(rows)
    run = [a for a in arms if "refused" not in rows[a]]
    short = [a for a in rows if "refused" not in rows[a] and rows[a].get("seeds", 0) < look]
    out = {"look": look, "arms": len(arms), "ready": not short and bool(run), "short": short,
           "noise_floor": rows.get(NOISE_FLOOR, {}).get("verdict")}
    if not out["ready"]:
        return out
    family = [a for a in run if rows[a].get("p_holm") is not None and rows[a]["p_holm"] < ALPHA
              and rows[a].get("verdict") in ("better", "worse")]
    alone = [a for a in run if a not in family and rows[a].get("verdict") in ("better", "worse")]
    rest = [rows[a]["ci95"] for a in run if a not in family and rows[a].get("ci95")]
    ratios = {a: rows[a]["tokens_ratio_ci95"] for a in run if rows[a].get("tokens_ratio_ci95")}
    return out | {
        "claimed": [{"arm": a, "verdict": rows[a]["verdict"], "difference": rows[a]["difference"],
                     "ci95": rows[a].get("ci95"), "p_holm": rows[a]["p_holm"]} for a in family],
        "per_arm_only": [{"arm": a, "verdict": rows[a]["verdict"], "p": rows[a]["p"],
                          "p_holm": rows[a].get("p_holm")} for a in alone],
        "failed": [a for a in arms if "refused" in rows[a]],
        "bounds": [min(lo for lo, _ in rest) * 100, max(hi for _, hi in rest) * 100] if rest else None,
        "faster": [a for a, (_, hi) in ratios.items() if hi < 1 and not never_reached(rows[a])],
        "slower": [a for a, (lo, _) in ratios.items() if lo > 1],
        "never_reached": {a: n for a in run if (n := never_reached(rows[a]))}}


def reading_lines(reading: dict) -> list[str]:
    """The reading as the ledger's markdown prints it under its table."""
    look = reading["look"]
    if not reading["ready"]:
        return [f"**Reading:** not yet — the rule reads this table when every arm has {look} seeds paired with the "
                f"baseline; {len(reading['short'])} arm{'s' if len(reading['short']) != 1 else ''} "
                f"{'have' if len(reading['short']) != 1 else 'has'} fewer. The rows above are interim."]
    lines = [f"**Reading** (every arm at ≥ {look} seeds; a difference is claimed only when its Holm p over the "
             f"table's {reading['arms']} method arms is below {ALPHA:.2f}):"]
    if reading["noise_floor"] not in (None, NO_DIFFERENCE):
        lines.append(f"- The noise floor reads \"{reading['noise_floor']}\": the rule failed its own check here; "
                     "distrust every verdict below.")
    for c in reading["claimed"]:
        word = "beats" if c["verdict"] == "better" else "loses to"
        lines.append(f"- `{c['arm']}` {word} its baseline family-wise: {_points(c)} "
                     f"(Holm p {c['p_holm']:.3f}).")
    for c in reading["per_arm_only"]:
        holm = "—" if c["p_holm"] is None else f"{c['p_holm']:.3f}"
        lines.append(f"- `{c['arm']}` reads {c['verdict']} on its own p ({c['p']:.3f}) but not family-wise "
                     f"(Holm p {holm}): not claimed — the table's chance verdict is this likely.")
    if not reading["claimed"]:
        bounds = "" if reading["bounds"] is None else (
            f"; the arms' intervals span {reading['bounds'][0]:+.1f} to {reading['bounds'][1]:+.1f} points — effects "
            "inside that range are not told apart from none")
        lines.append(f"- No method arm differs detectably from its baseline family-wise{bounds}.")
    never = reading.get("never_reached", {})
    for key, word in (("faster", "fewer"), ("slower", "more")):
        if reading[key]:
            arms = ", ".join(f"`{a}`" + (f" ({never[a]} of its seeds never got there)" if a in never else "")
                             for a in reading[key])
            lines.append(f"- Generated tokens to the baseline's final accuracy: {arms} needed {word} than the "
                         "baseline (interval excludes 1×; a secondary measure, not adjusted over the family: stated, "
                         "not claimed).")
    if not reading["faster"] and not reading["slower"]:
        lines.append("- Generated tokens to the baseline's final accuracy: no arm's interval excludes 1×.")
    if reading["failed"]:
        lines.append(f"- Failed to run (refused): {', '.join(f'`{a}`' for a in reading['failed'])}.")
    return lines
