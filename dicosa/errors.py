"""Errors a user can act on: the command lines print them as one sentence, no traceback.

This module imports nothing of dicosa's, so that catching :data:`USER_ERRORS` loads no
model, training or search code. The error classes of configs, checkpoints, CLIP weights,
data, heads, training and files are defined here; the modules that raise them import them
from here, and they stay importable from those modules too (``dicosa.config.ConfigError``).
The search engine's errors (``StoreError``, ``StageError``, ``QueryError``, ...) are
``ValueError`` subclasses kept beside their code, caught as ``ValueError``.
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
    "IndexBusyError",
    "NoSpaceError",
    "NonFiniteLossError",
    "PretrainedWeightsError",
    "StorageError",
    "VideoDecodeError",
]


# ---------------------------------------------------------------- configs, checkpoints, heads


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


# ---------------------------------------------------------------- files and indexes


class StorageError(OSError):
    """A file could not be written or read for a filesystem reason; the message is one
    sentence (without OSError's ``[Errno N]`` prefix)."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


class IndexBusyError(RuntimeError):
    """Another process (or thread) is writing the index and the caller asked not to wait."""


# FileNotFoundError covers missing annotation files (AnnotationError) and checkpoints;
# ValueError covers configs, checkpoints, heads, indexes, stages and queries that do not fit
# (the ValueError subclasses here and the search engine's: StoreError, StageError, QueryError,
# ...), and bad arguments; NoSpaceError and StorageError a full disk or another filesystem
# failure while writing.
USER_ERRORS: tuple[type[BaseException], ...] = (
    ConfigError, FileNotFoundError, FileExistsError, ValueError, VideoDecodeError,
    PretrainedWeightsError, NonFiniteLossError, NoSpaceError, StorageError, IndexBusyError,
)
