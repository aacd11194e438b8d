"""Typed configuration: frozen dataclasses, loaded from YAML with unknown keys rejected.

A run's configuration is one :class:`Config` with four sections (``model``, ``data``,
``train``, ``eval``) and a ``protocol``. YAML files under ``configs/`` hold the paper's settings
per dataset and ship with the package (:func:`find_config` finds them by name, in a source
checkout and in an installed copy alike); command-line overrides use dotted keys
(``train.lr=3e-5``). ``protocol: released`` turns on every switch that reproduces the authors'
released training and evaluation (:data:`PROTOCOLS`); keys set explicitly win over the
protocol's. Nothing in here imports the rest of the package.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path, PurePath
from typing import Any, Literal

import yaml

from .errors import ConfigError

log = logging.getLogger(__name__)

# The model without a checkpoint or a config: CLIP zero-shot (the "zero-shot" model preset),
# which ranks as CLIP does; DiCoSA built from CLIP weights alone would score through an
# untrained temporal transformer and concept head (dicosa.loading).
DEFAULT_CONFIG = "configs/zero-shot.yaml"

Variant = Literal["released", "paper"]
Protocol = Literal["dicosa", "released"]


@dataclass(frozen=True)
class ModelConfig:
    """The network and its losses (paper §3, Appendix B)."""

    arch: str = "ViT-B-32"
    # "openai" (or any open_clip pretrained tag), a local checkpoint path, or None for random.
    pretrained: str | None = "openai"
    # "released" reproduces the authors' code (and their table); "paper" follows the equations.
    variant: Variant = "released"
    num_frames: int = 12  # N_v
    max_words: int = 32  # N_t
    num_concepts: int = 8  # K
    pool_temperature: float = 3.0  # τ of Eq. 1
    temporal_layers: int = 4  # 0: no temporal transformer (the frame vectors as CLIP gives them)
    confidence_expansion: int = 4  # hidden width of the Eq. 8 MLP, in multiples of D/K
    logit_scale_max: float = 100.0  # 1/τ' of Eq. 10
    alpha: float = 0.01
    beta: float = 0.005
    # Ablation switches (benchmarks/ablation.py); the defaults are the full method.
    use_factors: bool = True
    use_adaptive_pooling: bool = True
    # L2-normalise T and every frame vector (CLIP's cosine space): Eq. 1 then weighs the
    # frames by their cosine to the text, and S is a cosine of unit vectors' pools. The
    # ``zero-shot`` preset's setting (:data:`MODEL_PRESETS`); DiCoSA scores raw vectors.
    normalize_features: bool = False
    grad_checkpointing: bool = False


# Named model presets: ModelConfig fields on top of the defaults.
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    # CLIP as it comes, scored by a parameter-free text-conditioned pooling of the frames:
    # S = cos(T, Σ_i a_i f_i) with a = softmax_i(cos(T, f_i) / τ) over unit vectors (the
    # zero-shot form of X-Pool's pooling; τ → ∞ gives the frame mean). No temporal
    # transformer (temporal_layers 0), no concept factors or confidence MLP (use_factors
    # off: K = 1, g = 1): nothing untrained touches the features or the score. τ = 0.01 is
    # CLIP's own temperature (its logit scale, 100), the scale on which CLIP's cosines were
    # trained to be compared; frames are text-pooled as sharply as CLIP ranks images. The
    # 77 text positions are CLIP's own context, so the text vector is CLIP's.
    "zero-shot": {"arch": "ViT-B-32", "pretrained": "openai", "variant": "paper",
                  "num_frames": 12, "max_words": 77, "num_concepts": 1,
                  "pool_temperature": 0.01, "temporal_layers": 0, "use_factors": False,
                  "use_adaptive_pooling": False, "normalize_features": True},
}


def model_preset(name: str, **overrides: Any) -> ModelConfig:
    """The :class:`ModelConfig` of preset ``name`` (:data:`MODEL_PRESETS`) with ``overrides``
    (e.g. ``arch``, ``pretrained`` for a random-weight test model)."""
    if name not in MODEL_PRESETS:
        raise ConfigError(f"unknown model preset {name!r}; known: {', '.join(MODEL_PRESETS)}")
    return _build(ModelConfig, {**MODEL_PRESETS[name], **overrides}, "model.")


@dataclass(frozen=True)
class DataConfig:
    dataset: str = "msrvtt"
    root: str = "data/msrvtt"
    train_split: str = "9k"
    test_split: str = "1k-A"
    # Fraction of training videos held out for model selection (MSR-VTT 9k has no val split).
    val_fraction: float = 0.05
    video_dir: str | None = None  # default: <root>/videos
    num_workers: int = 8
    # "segments": N equal segments, a random frame of each in training, the centre in
    # evaluation. "released": the frames at 1 fps, then N evenly spaced among those, in
    # training too (the authors' loader).
    frame_sampling: Literal["segments", "released"] = "segments"
    # Rows past a short clip's frames: "black", or CLIP's "mean" colour (the released loader
    # pads with zeros after normalisation, i.e. the mean colour).
    frame_padding: Literal["black", "mean"] = "black"
    # A timm RandAugment string applied to training clips, the same ops on every frame of a
    # clip (released: "rand-m7-n4-mstd0.5-inc1"); None for no augmentation.
    augment: str | None = None


@dataclass(frozen=True)
class TrainConfig:
    batch_size: int = 128
    epochs: int = 5
    lr: float = 1e-4  # new modules
    clip_lr: float = 1e-7  # CLIP towers
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-6
    weight_decay: float = 0.2
    warmup_fraction: float = 0.1
    grad_clip: float = 1.0
    seed: int = 42
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = "auto"
    # torch.compile the towers; None: on CUDA only (the "fast mode" of benchmarks/RESULTS.md).
    compile: bool | None = None
    output_dir: str = "runs/default"
    log_every: int = 10
    eval_every_epochs: int = 1
    select_on_test: bool = False
    max_steps: int | None = None  # stop early (smoke runs, learning tests)
    # Also write last.pt every this many optimiser steps (resume after a crash mid-epoch).
    checkpoint_every: int | None = None
    # "adamw" (bias-corrected, decoupled decay); "bertadam": the released optimiser (no bias
    # correction, every tensor's gradient clipped to norm 1 before the update).
    optimizer: Literal["adamw", "bertadam"] = "adamw"
    # "cosine": linear warm-up, then cosine over the remaining steps; "released": linear
    # warm-up, then the cosine of the whole run's progress (not restarted after warm-up).
    schedule: Literal["cosine", "released"] = "cosine"
    # Which parameters skip weight decay. "clip": biases, norms, embeddings, logit scale;
    # "released": names containing "bias" only (CLIP's ln_* weights and embeddings decay).
    weight_decay_rule: Literal["clip", "released"] = "clip"
    # Do not train the CLIP towers (image, text, logit scale). The released code's fp16
    # towers at lr 1e-7 round nearly every update away, so its towers are in effect frozen.
    freeze_towers: bool = False
    # "full": every parameter gets the gradient of the global-batch loss. "released": the
    # parameters before the all-gather (towers, temporal transformer) get 1/W of it under W
    # processes, as with the released all-gather (its backward keeps the local slice only).
    tower_grad: Literal["full", "released"] = "full"
    # After training, fit the distilled first-stage summary of best.pt on the training split
    # (dicosa/heads/summary.py) and keep it beside it as best.summary.pt, where index finds
    # it. Minutes on a CPU for MSR-VTT-sized splits (the run log's "summary" event says).
    fit_summary: bool = True
    # key=value settings of that summary head (as ``heads train summary --set``).
    summary_options: tuple[str, ...] = ()


@dataclass(frozen=True)
class EvalConfig:
    batch_size: int = 64
    score_chunk: int = 256
    postprocess: tuple[str, ...] = ()  # any of "dsl", "qbnorm"
    qb_k: int = 1
    qb_beta: float = 70.0
    qb_theta_t2v: float = 3.0
    qb_theta_v2t: float = 5.0
    cache_dir: str | None = None
    # QB-Norm's query banks from the training split. "first-caption": the first caption of
    # every training video (t2v) and every training video once (v2t); "all-captions": every
    # caption, and the video of every caption (videos repeat); "released": what the released
    # loader builds for the dataset (MSR-VTT: first-caption; the others: all-captions).
    qb_bank: Literal["released", "first-caption", "all-captions"] = "released"
    # Encoding and scoring of reported numbers: fp32, or bf16 autocast on request.
    precision: Literal["fp32", "bf16"] = "fp32"


@dataclass(frozen=True)
class Config:
    protocol: Protocol = "dicosa"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(dataclasses.asdict(self))

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_yaml())


def _to_plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_plain(v) for v in obj]
    return obj


def _unknown_key(key: str, valid: Iterable[str], where: str) -> ConfigError:
    valid = list(valid)
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    hint = f"; did you mean '{close[0]}'?" if close else f"; valid keys: {', '.join(valid)}"
    return ConfigError(f"unknown config key '{where}{key}'{hint}")


def _coerce(value: Any, annotation: Any, name: str) -> Any:
    """Convert a YAML/CLI value to the field's declared type, or raise ConfigError."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, name)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"'{name}': cannot use {value!r} ({'; '.join(errors)})")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"'{name}' must be one of {list(args)}, got {value!r}")
        return value
    if origin is tuple:
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"'{name}' must be a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], name) for v in value)
        if len(args) != len(value):
            raise ConfigError(f"'{name}' needs {len(args)} values, got {value!r}")
        return tuple(_coerce(v, a, name) for v, a in zip(value, args, strict=True))
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"'{name}' must be true or false, got {value!r}")
    if annotation in (int, float):
        try:
            number = None if isinstance(value, bool) else float(value)
        except (TypeError, ValueError):
            number = None
        if number is None or (annotation is int and not number.is_integer()):
            what = "an integer" if annotation is int else "a number"
            raise ConfigError(f"'{name}' must be {what}, got {value!r}")
        return annotation(number)
    if annotation is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"'{name}' must be a string, got {value!r}")
        return str(value)
    return value


def _build(cls: type, values: Mapping[str, Any], where: str) -> Any:
    if not isinstance(values, Mapping):
        raise ConfigError(f"section '{where.rstrip('.')}' must be a mapping, got {values!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in values.items():
        if key not in names:
            raise _unknown_key(str(key), names, where)
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            kwargs[key] = _build(hint, value or {}, f"{where}{key}.")
        else:
            kwargs[key] = _coerce(value, hint, f"{where}{key}")
    return cls(**kwargs)


def dataclass_from_dict(cls: type, values: Mapping[str, Any], where: str = "") -> Any:
    """Build any config dataclass (a head's, say) from a mapping, with the same type coercion
    and unknown-key errors as :class:`Config`; ``where`` prefixes keys in messages."""
    return _build(cls, values, where)


# Every switch that makes a run follow the authors' released code (docs/training.md, "The
# released protocol"); the variant's own differences come with model.variant.
PROTOCOLS: dict[str, dict[str, dict[str, Any]]] = {
    "dicosa": {},
    "released": {
        "model": {"variant": "released"},
        "data": {"frame_sampling": "released", "frame_padding": "mean",
                 "augment": "rand-m7-n4-mstd0.5-inc1"},
        "train": {"optimizer": "bertadam", "schedule": "released", "betas": [0.9, 0.98],
                  "eps": 1.0e-6, "weight_decay": 0.2, "weight_decay_rule": "released",
                  "warmup_fraction": 0.1, "grad_clip": 1.0, "freeze_towers": True,
                  "tower_grad": "released"},
        "eval": {"qb_bank": "released", "qb_k": 1, "qb_beta": 70.0, "qb_theta_t2v": 3.0,
                 "qb_theta_v2t": 5.0},
    },
}

# Keys that older dicosa versions wrote (and checkpoints still hold): dropped with a warning.
_RETIRED_KEYS = {
    ("eval", "qb_bank_captions"): "the QB-Norm bank is now eval.qb_bank",
    ("eval", "qb_bank_videos"): "the QB-Norm bank is now eval.qb_bank",
}


def _with_protocol(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` on top of its protocol's settings (explicit keys win)."""
    protocol = values.get("protocol", "dicosa")
    if protocol not in PROTOCOLS:
        raise ConfigError(f"'protocol' must be one of {list(PROTOCOLS)}, got {protocol!r}")
    merged: dict[str, Any] = {k: dict(v) for k, v in PROTOCOLS[protocol].items()}
    for key, value in values.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key].update(value)
        else:
            merged[key] = value
    return merged


def _drop_retired(values: dict[str, Any]) -> dict[str, Any]:
    for (section, key), why in _RETIRED_KEYS.items():
        if isinstance(values.get(section), Mapping) and key in values[section]:
            values[section] = {k: v for k, v in values[section].items() if k != key}
            log.warning("ignoring retired config key '%s.%s' (%s)", section, key, why)
    return values


def config_from_dict(values: Mapping[str, Any]) -> Config:
    """Build a :class:`Config`, its ``protocol``'s settings under the given ones; unknown keys
    raise :class:`ConfigError` naming the nearest key."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"a config must be a mapping, got {type(values).__name__}")
    cfg = _build(Config, _drop_retired(_with_protocol(values)), "")
    validate(cfg)
    return cfg


def load_config(path: str | Path, overrides: Iterable[str] = ()) -> Config:
    """Read a YAML config, apply ``section.key=value`` overrides, validate."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    return config_from_text(path.read_text(), overrides)


def config_from_text(text: str, overrides: Iterable[str] = ()) -> Config:
    """A config file's YAML ``text`` (as an index's manifest keeps a copy of it), with
    ``section.key=value`` overrides applied, validated."""
    return config_from_dict(apply_overrides(yaml.safe_load(text) or {}, overrides))


# ---------------------------------------------------------------- shipped configs


def config_dir() -> Path:
    """The folder of the configs that ship with dicosa.

    The repository's top-level ``configs/`` is the one copy: a built wheel carries it as the
    package data ``dicosa/configs`` (``setup.py`` maps the folder onto the subpackage
    ``dicosa.configs``), read through :mod:`importlib.resources`; a source checkout, run in
    place or installed editable, reads ``configs/`` beside the package.
    """
    packaged = resources.files("dicosa").joinpath("configs")
    if packaged.is_dir():
        return Path(str(packaged))
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "pyproject.toml").is_file() and (checkout / "configs").is_dir():
        return checkout / "configs"
    raise ConfigError("this installation of dicosa has lost its configs (dicosa/configs); "
                      "reinstall it, or give --config a YAML file")


def shipped_configs() -> list[str]:
    """The names of the shipped configs (``msrvtt``, ``synthetic``, ...), sorted."""
    return sorted(p.stem for p in config_dir().glob("*.yaml"))


def _shipped_name(config: str | Path) -> str | None:
    """The shipped config ``config`` may name: ``configs/NAME.yaml``, ``NAME.yaml`` or
    ``NAME``; None for any other path."""
    path = PurePath(config)
    parts = path.parts
    if path.is_absolute() or not parts or parts[:-1] not in ((), ("configs",)):
        return None
    return path.stem if path.suffix in (".yaml", ".yml") else path.name


def find_config(config: str | Path | None = None, dataset: str | None = None) -> Path:
    """The YAML file a command line names.

    Args:
        config: a file path, used when that file exists; otherwise the name of a shipped
            config, as ``configs/msrvtt.yaml``, ``msrvtt.yaml`` or ``msrvtt``.
        dataset: without ``config``, that dataset's shipped config (default ``msrvtt``).

    Raises:
        ConfigError: no such file and no shipped config of that name (the message lists the
            shipped ones).
    """
    if config is not None:
        if Path(config).is_file():
            return Path(config)
        name = _shipped_name(config)
    else:
        name = dataset or "msrvtt"
    if name:
        shipped = config_dir() / f"{name}.yaml"
        if shipped.is_file():
            return shipped
    known = ", ".join(shipped_configs())
    if config is not None:
        raise ConfigError(f"config file not found: {config} (the configs shipped with dicosa "
                          f"are {known})")
    raise ConfigError(f"no config for dataset '{name}' (the configs shipped with dicosa are "
                      f"{known})")


def resolve_config(config: str | Path | None, dataset: str | None,
                   overrides: Iterable[str] = ()) -> Config:
    """The config :func:`find_config` finds, with ``section.key=value`` overrides applied;
    ``dataset``, when given, must be the config's."""
    path = find_config(config, dataset)
    cfg = load_config(path, overrides)
    if dataset is not None and cfg.data.dataset != dataset:
        raise ConfigError(f"--dataset {dataset} but {path} is for '{cfg.data.dataset}'")
    return cfg


def apply_overrides(values: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` strings (values parsed as YAML scalars) to a nested dict;
    ``protocol=NAME`` sets the protocol."""
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in values.items()}
    sections = {f.name for f in dataclasses.fields(Config)} - {"protocol"}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' must look like section.key=value")
        dotted, raw = item.split("=", 1)
        if dotted == "protocol":
            out["protocol"] = raw
            continue
        parts = dotted.split(".")
        if len(parts) != 2:
            raise ConfigError(f"override '{item}': key must be section.key, e.g. train.lr")
        section, key = parts
        if section not in sections:
            raise _unknown_key(section, sorted(sections), "")
        out.setdefault(section, {})[key] = yaml.safe_load(raw) if raw else raw
    return out


def replace(cfg: Config, **sections: Mapping[str, Any]) -> Config:
    """Return a copy of ``cfg`` with some fields of some sections changed, validated."""
    values = cfg.to_dict()
    for section, changes in sections.items():
        if section not in values:
            raise _unknown_key(section, values.keys(), "")
        values[section].update(changes)
    return config_from_dict(values)


def validate(cfg: Config) -> None:
    m = cfg.model
    if m.num_concepts < 1:
        raise ConfigError(f"model.num_concepts must be >= 1, got {m.num_concepts}")
    if m.temporal_layers < 0:
        raise ConfigError(f"model.temporal_layers must be >= 0, got {m.temporal_layers}")
    if m.num_frames < 1 or m.max_words < 3:
        raise ConfigError("model.num_frames must be >= 1 and model.max_words >= 3")
    if m.pool_temperature <= 0:
        raise ConfigError("model.pool_temperature must be positive")
    if not 0.0 <= cfg.data.val_fraction < 1.0:
        raise ConfigError("data.val_fraction must be in [0, 1)")
    for name in cfg.eval.postprocess:
        if name not in ("dsl", "qbnorm"):
            raise ConfigError(f"eval.postprocess: unknown method '{name}' (use dsl, qbnorm)")
    augment = cfg.data.augment
    if augment is not None and not augment.startswith("rand-"):
        raise ConfigError(f"data.augment must be a timm RandAugment string such as "
                          f"'rand-m7-n4-mstd0.5-inc1', got {augment!r}")
