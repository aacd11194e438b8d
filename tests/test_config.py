import pytest
import yaml

from dicosa.config import Config, ConfigError, config_from_dict, load_config, replace


def test_defaults_are_the_papers_settings():
    cfg = Config()
    assert (cfg.model.num_frames, cfg.model.max_words, cfg.model.num_concepts) == (12, 32, 8)
    assert (cfg.model.alpha, cfg.model.beta, cfg.model.pool_temperature) == (0.01, 0.005, 3.0)
    assert cfg.model.variant == "released"


def test_unknown_key_names_the_nearest(tmp_path):
    with pytest.raises(ConfigError, match=r"model\.num_concept'.*num_concepts"):
        config_from_dict({"model": {"num_concept": 4}})
    with pytest.raises(ConfigError, match=r"unknown config key 'trian'.*train"):
        config_from_dict({"trian": {}})


def test_values_are_typed_and_checked():
    cfg = config_from_dict({"train": {"lr": "3e-5", "betas": [0.9, 0.99]}})
    assert cfg.train.lr == 3e-5 and cfg.train.betas == (0.9, 0.99)
    with pytest.raises(ConfigError, match="variant"):
        config_from_dict({"model": {"variant": "other"}})
    with pytest.raises(ConfigError, match="integer"):
        config_from_dict({"train": {"epochs": 2.5}})


def test_yaml_round_trip_and_overrides(tmp_path):
    cfg = replace(Config(), model={"num_concepts": 4}, eval={"postprocess": ["dsl"]})
    path = tmp_path / "c.yaml"
    cfg.save(path)
    again = load_config(path, ["train.lr=0.001", "model.pretrained=null"])
    assert again.model.num_concepts == 4 and again.eval.postprocess == ("dsl",)
    assert again.train.lr == 0.001 and again.model.pretrained is None
    assert yaml.safe_load(path.read_text())["model"]["num_concepts"] == 4
    with pytest.raises(ConfigError, match=r"section\.key"):
        load_config(path, ["lr=1"])


def test_shipped_configs_load():
    from pathlib import Path

    files = sorted(Path(__file__).parents[1].joinpath("configs").glob("*.yaml"))
    for f in files:
        load_config(f)
