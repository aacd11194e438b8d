"""Errors a user can act on: the command lines print them as one sentence, no traceback.

Every error class a user may meet is defined here, and this module imports nothing of
dicosa's, so that catching :data:`USER_ERRORS` loads no model, training or search code. The
modules that raise them import them from here (and keep them importable under their old
names, e.g. ``dicosa.config.ConfigError``).
"""

from __future__ import annotations

import os

__all__ = [
    "USER_ERRORS",
    "AnnotationError",
    "CheckpointError",
    "ConfigError",
    "ConversionError",
    "HeadMismatchError",
    "MilvusError",
    "NoSpaceError",
    "NonFiniteLossError",
    "PretrainedWeightsError",
    "QueryError",
    "SeismicUnavailableError",
    "SparseIndexError",
    "StageError",
    "StoreError",
    "VideoDecodeError",
]


# ---------------------------------------------------------------- configuration and files


class ConfigError(ValueError):
    """A configuration key or value that cannot be used, or a config file that is not there."""


class CheckpointError(ValueError):
    """A file that cannot be used as a checkpoint: not one, damaged, or of another version."""


class ConversionError(CheckpointError):
    """A state dict that is not (or not entirely) the released code's DiCoSA."""


class NoSpaceError(OSError):
    """A file could not be written for lack of space; the previous file is intact."""

    def __str__(self) -> str:  # the sentence alone, without OSError's "[Errno 28]" prefix
        return self.strerror


class PretrainedWeightsError(RuntimeError):
    """CLIP's pretrained weights could not be fetched or read."""


class HeadMismatchError(ValueError):
    """A head file that does not fit the model it is used with (or is no head at all)."""


# ---------------------------------------------------------------- data and training


class AnnotationError(FileNotFoundError):
    """An annotation file that is missing or not in the expected format."""


class VideoDecodeError(RuntimeError):
    """A video file that is missing, empty or cannot be decoded.

    Attributes:
        path: the offending file.
        reason: a short human-readable cause.
    """

    def __init__(self, path: str | os.PathLike, reason: str | None = None) -> None:
        self.path = str(path)
        self.reason = reason or "cannot be decoded"
        # (path, reason) as args so the error pickles; a DataLoader rebuilds it in the parent
        # from its message alone, which then reads as the path with no reason.
        super().__init__(self.path, reason)

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}" if self.args[1] else self.path


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or infinite; the state of that step was not saved."""


# ---------------------------------------------------------------- search


class QueryError(ValueError):
    """A query that cannot be searched (empty text, an empty exclusion)."""


class StoreError(ValueError):
    """A store file that is missing, damaged or does not match its manifest."""


class StageError(ValueError):
    """A first stage cannot do what was asked (wrong width, duplicate ids, unknown backend,
    unreachable server); the message is one sentence."""


class MilvusError(StageError):
    """Milvus cannot be reached or refused an operation; one sentence."""


class SparseIndexError(ValueError):
    """Rows or files that do not fit the sparse index (one sentence)."""


class SeismicUnavailableError(SparseIndexError):
    """The optional ``pyseismic-lsr`` package is not installed (one sentence)."""


# FileNotFoundError covers missing annotation files (AnnotationError) and checkpoints;
# ValueError covers configs, checkpoints, heads, indexes and queries that do not fit (every
# ValueError subclass above), and bad arguments; NoSpaceError a full disk while writing.
USER_ERRORS: tuple[type[BaseException], ...] = (
    ConfigError, FileNotFoundError, FileExistsError, ValueError, VideoDecodeError,
    PretrainedWeightsError, NonFiniteLossError, NoSpaceError,
)
