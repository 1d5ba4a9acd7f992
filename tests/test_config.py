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


def test_cross_section_fills_fill_only_what_the_recipe_leaves_unset():
    """train/config.py's FILLS: ReMix's KL terms, the stale-token correction, DAPO's dynamic sampling."""
    from rollwise.train.config import FILLS

    assert [f.apply.__name__ for f in FILLS] == ["_fill_remix", "_fill_stale_token_correction",
                                                 "_fill_low_precision_correction", "fill_brorl", "_fill_nudge",
                                                 "_fill_preset_sections"]
    cfg = load_run_config(None, ["objective.method=dapo", "replay.method=remix"])
    assert cfg.control.method == "dynamic_sampling"
    assert cfg.objective.beta == cfg.objective.prox_kl_coef == cfg.replay.remix.beta / 2
    assert cfg.objective.tis_mode == "token_truncate"  # remix serves stored groups: stale tokens
    cfg = load_run_config(None, ["objective.method=dapo", "replay.method=remix", "control.method=none",
                                 "objective.beta=0.0", "objective.tis_mode=token_mask"])
    assert (cfg.control.method, cfg.objective.beta, cfg.objective.tis_mode) == ("none", 0.0, "token_mask")
    assert cfg.objective.prox_kl_coef == cfg.replay.remix.beta / 2  # the key left unset is still filled
    cfg = load_run_config(None, [])
    assert (cfg.control.method, cfg.objective.beta, cfg.objective.tis_mode) == ("none", 0.0, "sequence_mask")


@pytest.mark.parametrize("override, suggestion", [
    ("optm.lr=1e-4", "did you mean 'optim'?"),  # a misspelt section
    ("model.lora.rr=4", "did you mean 'model.lora.r'?"),  # inside an optional section (lora: null by default)
    ("lora.r=4", "did you mean 'model.lora'?"),  # a section written at the wrong level
    ("tree.max_depth=2", "did you mean 'rollout.tree'?"),
    ("rollout.lr=1e-4", "did you mean 'optim.lr' or 'sft.lr'"),  # a key of other sections
])
def test_section_typos_get_a_suggestion(override, suggestion):
    with pytest.raises(ConfigError) as err:
        load_run_config(None, [override])
    assert suggestion in str(err.value)


def test_optional_section_lists_its_keys():
    with pytest.raises(ConfigError, match=r"valid here: .*alpha.*\br\b"):
        load_run_config(None, ["model.lora.rr=4"])
