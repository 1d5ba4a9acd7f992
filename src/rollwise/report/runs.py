"""What the report reads from a run directory, as plain records: metrics, samples, training rollouts,
trees, config, summary."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rollwise.config import ConfigError
from rollwise.types import is_correct

X_AXES = {"step": "step", "tokens": "generated tokens", "wall": "wall time (s)"}


@dataclass
class Run:
    """One run directory, read once."""

    name: str
    path: Path
    metrics: list[dict]  # metrics.jsonl lines: training steps and evals
    samples: list[dict] = field(default_factory=list)  # samples.jsonl: greedy eval rollouts
    trees: list[dict] = field(default_factory=list)  # trees.jsonl: one training tree per eval
    rollouts: list[dict] = field(default_factory=list)  # rollouts.jsonl: training groups (train/rollout_log.py)
    config: dict = field(default_factory=dict)  # config.yaml
    summary: dict | None = None  # summary.json (absent while a run is going or was killed)

    def x_of(self) -> dict[str, dict[int, float]]:
        """Per x axis, the value at each step: the step itself, generated tokens (``tokens/total``)
        and wall seconds (``time/step`` summed over the steps so far); step 0 is 0 on all three."""
        tokens, wall, elapsed = {0: 0.0}, {0: 0.0}, 0.0
        for m in self.metrics:
            if "time/step" in m:
                elapsed += _number(m["time/step"]) or 0.0
                wall[m["step"]] = elapsed
            if "tokens/total" in m:
                tokens[m["step"]] = _number(m["tokens/total"]) or 0.0
        steps = {m["step"]: float(m["step"]) for m in self.metrics}
        return {"step": steps | {0: 0.0}, "tokens": tokens, "wall": wall}

    def series(self, metric: str) -> list[tuple[int, float]]:
        """(step, value) of every line that logged ``metric`` as a number."""
        return [(m["step"], v) for m in self.metrics if metric in m and (v := _number(m[metric])) is not None]

    def metric_names(self) -> list[str]:
        names = {k for m in self.metrics for k, v in m.items() if k != "step" and _number(v) is not None}
        return sorted(names)

    def headline(self) -> dict:
        """Task, method, steps, initial → final accuracy, wall, generated tokens: from ``summary.json``,
        else from the metrics (a run still going, or killed)."""
        if self.summary:
            return self.summary
        acc = [v for _, v in self.series("eval/accuracy")]
        steps = max((m["step"] for m in self.metrics), default=0)
        return {
            "task": (self.config.get("task") or {}).get("name"),
            "method": (self.config.get("objective") or {}).get("method"),
            "steps": steps, "initial_accuracy": acc[0] if acc else None, "final_accuracy": acc[-1] if acc else None,
            "wall_seconds": round(sum(_number(m.get("time/step")) or 0.0 for m in self.metrics), 2),
            "generated_tokens": int(self.x_of()["tokens"].get(steps, 0)),
        }

    def reward_failures(self) -> dict[str, int]:
        """Per reward function, the completions it failed on over the run (``reward/<fn>/errors`` and
        ``/non_finite`` summed over steps); only those with any."""
        out: dict[str, int] = {}
        for name in self.metric_names():
            parts = name.split("/")
            if len(parts) == 3 and parts[0] == "reward" and parts[2] in ("errors", "non_finite"):
                total = int(sum(v for _, v in self.series(name)))
                if total:
                    out[parts[1]] = out.get(parts[1], 0) + total
        return out

    def zero_signal_share(self) -> float | None:
        """The mean share of a step's groups whose rewards did not spread (nothing trains on them)."""
        values = [v for _, v in self.series("groups/zero_signal")]
        return sum(values) / len(values) if values else None


def _number(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSONL file ([] when absent); a line cut by a kill is skipped."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a kill
            continue
    return out


def load_run(path: Path, name: str | None = None) -> Run:
    path = Path(path)
    if not (path / "metrics.jsonl").exists():
        raise ConfigError(f"{path} is not a run directory (no metrics.jsonl): pass runs/<name>")
    config = yaml.safe_load((path / "config.yaml").read_text()) if (path / "config.yaml").exists() else {}
    summary = json.loads((path / "summary.json").read_text()) if (path / "summary.json").exists() else None
    return Run(name or path.name, path, read_jsonl(path / "metrics.jsonl"), read_jsonl(path / "samples.jsonl"),
               read_jsonl(path / "trees.jsonl"), read_jsonl(path / "rollouts.jsonl"), config or {}, summary)


def load_runs(paths: list[Path]) -> list[Run]:
    """Runs named by their directory; two directories with one name get their parent's name too."""
    paths = [Path(p) for p in paths]
    names = [p.resolve().name for p in paths]
    return [load_run(p, f"{p.resolve().parent.name}/{n}" if names.count(n) > 1 else n) for p, n in zip(paths, names)]


def flatten(config: dict, prefix: str = "") -> dict[str, object]:
    """Nested config → dotted keys (``{"optim": {"lr": 1}}`` → ``{"optim.lr": 1}``); lists stay values.

    >>> flatten({"optim": {"lr": 0.1}, "seed": 0})
    {'optim.lr': 0.1, 'seed': 0}
    """
    out: dict[str, object] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out |= flatten(v, key + ".")
        else:
            out[key] = v
    return out


MISSING = "—"


def config_diff(configs: list[dict]) -> dict[str, list]:
    """The flattened keys whose values differ between ``configs``, with each config's value
    (``MISSING`` where a config lacks the key)."""
    flat = [flatten(c) for c in configs]
    keys = sorted(set().union(*flat)) if flat else []
    table = {k: [f.get(k, MISSING) for f in flat] for k in keys}
    return {k: vals for k, vals in table.items() if len({json.dumps(v, sort_keys=True) for v in vals}) > 1}


def sample_correct(sample: dict) -> bool:
    """An eval sample's verdict (its reward is the judge's score)."""
    return is_correct(_number(sample.get("reward")) or 0.0)
