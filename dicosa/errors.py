"""Errors a user can act on: the command lines print them as one sentence, no traceback."""

from __future__ import annotations

from .checkpoint import NoSpaceError
from .clip import PretrainedWeightsError
from .config import ConfigError
from .data.video import VideoDecodeError
from .files import StorageError
from .training import NonFiniteLossError

# FileNotFoundError covers missing annotation files (AnnotationError) and checkpoints;
# ValueError covers checkpoints, heads or indexes that do not fit (CheckpointError,
# HeadMismatchError), and bad arguments; NoSpaceError a full disk while writing.
USER_ERRORS: tuple[type[BaseException], ...] = (
    ConfigError, FileNotFoundError, FileExistsError, ValueError, VideoDecodeError,
    PretrainedWeightsError, NonFiniteLossError, NoSpaceError, StorageError,
)


class IndexBusyError(RuntimeError):
    """Another process (or thread) is writing the index and the caller asked not to wait."""


USER_ERRORS = (*USER_ERRORS, IndexBusyError)
