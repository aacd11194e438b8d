import re

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


def test_released_protocol_turns_on_every_switch_and_explicit_keys_win(tmp_path):
    from pathlib import Path

    from dicosa.config import PROTOCOLS

    preset = load_config(Path(__file__).parents[1] / "configs" / "msrvtt-released.yaml")
    assert preset.protocol == "released"
    for section, values in PROTOCOLS["released"].items():
        for key, value in values.items():
            got = getattr(getattr(preset, section), key)
            assert got == (tuple(value) if isinstance(got, tuple) else value), (section, key)
    mine = config_from_dict({"protocol": "released", "train": {"freeze_towers": False}})
    assert not mine.train.freeze_towers and mine.train.optimizer == "bertadam"
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"model": {"variant": "paper"}}))
    assert load_config(path, ["protocol=released"]).data.frame_padding == "mean"
    assert load_config(path).data.frame_padding == "black"
    with pytest.raises(ConfigError, match="protocol"):
        config_from_dict({"protocol": "authors"})


def test_retired_bank_sizes_in_old_checkpoints_are_dropped_with_a_warning(caplog):
    cfg = config_from_dict({"eval": {"qb_bank_captions": 5000, "qb_bank_videos": 1000}})
    assert cfg.eval.qb_bank == "released"
    assert "qb_bank_captions" in caplog.text


def test_find_config_takes_a_file_first_then_a_shipped_name(tmp_path, monkeypatch):
    from pathlib import Path

    from dicosa.config import config_dir, find_config, shipped_configs

    monkeypatch.chdir(tmp_path)
    shipped = config_dir() / "msrvtt.yaml"
    assert config_dir() == Path(__file__).parents[1] / "configs"  # the checkout's one copy
    for name in ("configs/msrvtt.yaml", "msrvtt.yaml", "msrvtt", Path("configs/msrvtt.yaml")):
        assert find_config(name) == shipped
    assert find_config() == shipped and find_config(None, "msvd") == config_dir() / "msvd.yaml"
    assert {"msrvtt", "msrvtt-released", "synthetic"} <= set(shipped_configs())

    # a file of that name in the working directory wins over the shipped config
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "msrvtt.yaml").write_text("model: {num_concepts: 4}\n")
    assert find_config("configs/msrvtt.yaml") == Path("configs/msrvtt.yaml")
    assert load_config(find_config("configs/msrvtt.yaml")).model.num_concepts == 4
    assert find_config("msrvtt") == shipped


@pytest.mark.parametrize("name", ["nope", "configs/nope.yaml", "elsewhere/msrvtt.yaml",
                                  "/absolute/msrvtt.yaml"])
def test_find_config_names_the_shipped_ones_when_nothing_matches(name):
    from dicosa.config import find_config

    with pytest.raises(ConfigError, match=rf"config file not found: {re.escape(name)} .*msrvtt, "):
        find_config(name)
    with pytest.raises(ConfigError, match=r"no config for dataset 'nope'.*synthetic"):
        find_config(None, "nope")
