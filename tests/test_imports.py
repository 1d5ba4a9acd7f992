"""One import rule for what a recipe names as ``module:attr`` (reward functions, ``task.reward``,
environments, harnesses) and for relative data paths: the working directory, then the recipe's
directory; an error names the field, the module or file, every place looked and the fix."""

import json
import sys

import pytest

from rollwise import imports
from rollwise.config import ConfigError
from rollwise.filter.registry import resolve_rewards
from rollwise.tasks import arith
from rollwise.train.config import RewardConfig, load_run_config

REWARD = "def shout(completions, **kw):\n    return [float('!' in c) for c in completions]\n"
ENV = "class Echo:\n    def reset(self, **row):\n        return None\n"
HARNESS = "async def rollout(client, row):\n    return 1.0\n"
def rows(n):
    return "".join(json.dumps({"prompt": f"say {i}", "answer": str(i)}) + "\n" for i in range(n))


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    """(cwd, recipe dir, a unique module-name suffix); sys.path, sys.modules and the recipe dir restored after."""
    cwd, recipes = tmp_path / "work", tmp_path / "recipes"
    cwd.mkdir()
    recipes.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "path", list(sys.path))
    suffix = str(abs(hash(str(tmp_path))) % 10**8)
    before = set(sys.modules)
    yield cwd, recipes, suffix
    for name in set(sys.modules) - before:
        if name.endswith(suffix):
            sys.modules.pop(name)
    imports.set_recipe_dir(None)


def recipe(recipes, text="task:\n  name: file\n  path: data.jsonl\n"):
    (recipes / "r.yaml").write_text(text)
    return load_run_config(str(recipes / "r.yaml"))


def resolve(spec):
    """``rewards: [{name: spec}]`` on the arith task (the recipe directory as last loaded)."""
    return resolve_rewards([RewardConfig(name=spec)], arith.build(eval_size=2))


def test_reward_module_in_the_working_directory(dirs):
    cwd, _, sfx = dirs
    (cwd / f"my_rewards{sfx}.py").write_text(REWARD)
    cfg = load_run_config(None, [f"rewards=[{{name: 'my_rewards{sfx}:shout'}}]"])
    fns, _ = resolve_rewards(cfg.rewards, cfg.task.build(0))
    assert fns[0].name == "shout" and fns[0].fn(completions=["a!"]) == [1.0]


def test_reward_module_and_data_beside_the_recipe(dirs):
    _, recipes, sfx = dirs
    (recipes / f"rw{sfx}.py").write_text(REWARD)
    (recipes / "data.jsonl").write_text(rows(20))
    cfg = recipe(recipes, f"task:\n  name: file\n  path: data.jsonl\nrewards:\n  - name: rw{sfx}:shout\n")
    task = cfg.task.build(0)
    assert len(task.eval) == 2
    fns, _ = resolve_rewards(cfg.rewards, task)
    assert fns[0].fn(completions=["x"]) == [0.0]


def test_data_in_the_working_directory_wins(dirs):
    cwd, recipes, _ = dirs
    (recipes / "data.jsonl").write_text(rows(20))
    (cwd / "data.jsonl").write_text(rows(10))
    assert len(recipe(recipes).task.build(0).eval) == 1


def test_missing_module_says_where_it_looked(dirs):
    cwd, recipes, sfx = dirs
    recipe(recipes)
    with pytest.raises(ConfigError) as info:
        resolve(f"nope{sfx}:fn")
    msg = str(info.value)
    assert msg.startswith(f"rewards[0].name: cannot import module 'nope{sfx}'")
    assert str(cwd) in msg and str(recipes) in msg and "PYTHONPATH" in msg


def test_module_that_fails_on_import_names_its_error(dirs):
    cwd, _, sfx = dirs
    (cwd / f"bad{sfx}.py").write_text("import no_such_dependency_xyz\n")
    with pytest.raises(ConfigError, match=rf"rewards\[0\]\.name: importing module 'bad{sfx}' .*failed: "
                                          r"ModuleNotFoundError: No module named 'no_such_dependency_xyz'"):
        resolve(f"bad{sfx}:fn")
    (cwd / f"syn{sfx}.py").write_text("def f(:\n")
    with pytest.raises(ConfigError, match=rf"importing module 'syn{sfx}' .*SyntaxError"):
        resolve(f"syn{sfx}:fn")
    (cwd / f"noattr{sfx}.py").write_text("x = 1\n")
    with pytest.raises(ConfigError, match=rf"rewards\[0\]\.name: module 'noattr{sfx}' .*has no callable 'fn'"):
        resolve(f"noattr{sfx}:fn")


def test_environment_and_harness_follow_the_same_rule(dirs):
    from rollwise.serve.harness import load_harness
    from rollwise.tasks.environment import load_environment

    cwd, recipes, sfx = dirs
    recipe(recipes)
    (cwd / f"env{sfx}.py").write_text(ENV)
    (recipes / f"agent{sfx}.py").write_text(HARNESS)
    assert load_environment(f"env{sfx}:Echo").__name__ == "Echo"
    assert load_harness(f"agent{sfx}:rollout").__name__ == "rollout"
    assert str(recipes) in sys.path  # so the harness's worker process, which copies sys.path, imports it too
    with pytest.raises(ConfigError, match=rf"rollout\.environment: cannot import module 'gone{sfx}'.*{recipes}"):
        load_environment(f"gone{sfx}:Env")
    with pytest.raises(ConfigError, match=rf"rollout\.harness: cannot import module 'gone{sfx}'.*{recipes}"):
        load_harness(f"gone{sfx}:rollout")


def test_missing_data_file_names_both_places(dirs):
    cwd, recipes, _ = dirs
    with pytest.raises(ConfigError) as info:
        recipe(recipes).task.build(0)
    msg = str(info.value)
    assert msg.startswith("task.path: file 'data.jsonl' not found")
    assert str(cwd / "data.jsonl") in msg and str(recipes / "data.jsonl") in msg
