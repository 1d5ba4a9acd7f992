"""Config validation: unknown keys suggest the closest one, bad values name the field path."""

import pytest

from rollwise.config import ConfigError, apply_overrides, parse_override
from rollwise.train.config import RunConfig, load_run_config


def test_defaults_validate():
    cfg = load_run_config(None)
    assert isinstance(cfg, RunConfig)
    assert cfg.objective.scale_rewards == "group" and cfg.objective.loss_agg == "seq_mean_token_mean"


def test_unknown_key_names_it_and_the_closest_valid_key():
    with pytest.raises(ConfigError) as err:
        load_run_config(None, ["optim.learning_rat=1e-4"])
    assert "optim.learning_rat" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_run_config(None, ["rollout.num_generation=4"])
    assert "did you mean 'rollout.num_generations'" in str(err.value)


def test_unknown_key_inside_task_union():
    with pytest.raises(ConfigError) as err:
        load_run_config(None, ["task.max_digit=3"])
    msg = str(err.value)
    assert "max_digit" in msg and "max_digits" in msg


def test_wrong_type_and_range_name_the_field_path():
    with pytest.raises(ConfigError) as err:
        load_run_config(None, ["rollout.num_generations=zero"])
    assert "rollout.num_generations" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_run_config(None, ["optim.lr=-1"])
    assert "optim.lr" in str(err.value)


def test_preset_fills_only_unset_fields():
    cfg = load_run_config(None, ["objective.method=dr_grpo"])
    assert cfg.objective.scale_rewards == "none" and cfg.objective.loss_agg == "seq_mean_token_sum_norm"
    cfg = load_run_config(None, ["objective.method=dr_grpo", "objective.scale_rewards=batch"])
    assert cfg.objective.scale_rewards == "batch"


def test_override_parsing():
    assert parse_override("a.b=3") == (["a", "b"], 3)
    assert parse_override("a=[1, 2]") == (["a"], [1, 2])
    with pytest.raises(ConfigError):
        parse_override("novalue")
    with pytest.raises(ConfigError):
        apply_overrides({"a": 1}, ["a.b=2"])


def test_missing_recipe_file(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_run_config(str(tmp_path / "nope.yaml"))
    assert "nope.yaml" in str(err.value)
