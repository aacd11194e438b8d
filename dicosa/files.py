"""Files written whole or not at all, filesystem errors as one sentence, and fault points.

Every file dicosa writes into an index folder (and checkpoints' small companions) goes
through :func:`write_bytes_atomic`: the bytes go to a temporary name in the same folder, are
flushed (and fsync'ed when ``sync``), then renamed over the real name, so a reader sees the
old file or the new one, never half of one.

An ``OSError`` while writing (a full disk, a read-only filesystem, a permission) becomes a
:class:`StorageError` whose message is one sentence naming the file and what was being done.

**Fault points.** Tests of crash safety need a process to die, or a disk to fill, at an exact
write. Each write calls :func:`fault_point`; with the environment variable
``DICOSA_KILL_AT_WRITE=N`` the process SIGKILLs itself at the N-th write point (before the
rename: the file is not written), with ``DICOSA_FAIL_AT_WRITE=N`` that write raises ENOSPC.
``DICOSA_FAULT_LOG=FILE`` appends each write point's label to FILE, so a test can count them.
Unset (always, outside tests), a fault point costs one dictionary lookup.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import signal
from pathlib import Path

from .errors import StorageError

__all__ = ["StorageError", "fault_point", "file_sha256", "storage_error", "write_bytes_atomic",
           "write_text_atomic"]

_KILL, _FAIL, _LOG = "DICOSA_KILL_AT_WRITE", "DICOSA_FAIL_AT_WRITE", "DICOSA_FAULT_LOG"


def storage_error(exc: OSError, path: str | os.PathLike, action: str) -> StorageError:
    """``exc`` as one sentence: what was being done (``action``, e.g. "writing") to ``path``."""
    if isinstance(exc, StorageError):
        return exc
    code = exc.errno
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        text = (f"the disk is full (or over quota) while {action} {path}; free space and run "
                "the command again: what was committed before is intact")
    elif code == errno.EROFS:
        text = f"{path} is on a read-only filesystem: cannot finish {action} it"
    elif code in (errno.EACCES, errno.EPERM):
        text = f"permission denied while {action} {path}"
    elif code == errno.ENOENT:
        text = f"{path} does not exist (while {action} it)"
    else:
        text = f"{action} {path} failed: {exc.strerror or exc}"
    return StorageError(code or 0, text, str(path))


def fault_point(label: str) -> None:
    """A place where a write happens: see the module docstring (no-op unless a test asks)."""
    environ = os.environ
    if _KILL not in environ and _FAIL not in environ and _LOG not in environ:
        return
    count = _counter(environ)
    if _LOG in environ:
        with open(environ[_LOG], "a") as log:
            log.write(f"{count} {label}\n")
    if environ.get(_KILL) == str(count):
        os.kill(os.getpid(), signal.SIGKILL)
    if environ.get(_FAIL) == str(count):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), label)


def _counter(environ) -> int:
    """The write points met so far by this process, this one included (kept in the
    environment of this process: the one place a test hook may keep state here)."""
    count = int(environ.get("_DICOSA_WRITES", "0")) + 1
    environ["_DICOSA_WRITES"] = str(count)
    return count


def write_bytes_atomic(path: str | os.PathLike, data: bytes, *, sync: bool = False) -> Path:
    """Write ``path`` whole or not at all (temporary name, then rename), with the process's
    umask. ``sync`` fsyncs the file and its folder: the commit point of a transaction (an index
    manifest) survives a power cut, not only a killed process. Errors: :class:`StorageError`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        fault_point(path.name)
        with open(tmp, "wb") as fh:
            fh.write(data)
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
        if sync:
            _sync_folder(path.parent)
    except OSError as exc:
        raise storage_error(exc, path, "writing") from None
    finally:
        with contextlib.suppress(OSError):  # a read-only folder: nothing was created there
            tmp.unlink(missing_ok=True)
    return path


def write_text_atomic(path: str | os.PathLike, text: str, *, sync: bool = False) -> Path:
    """:func:`write_bytes_atomic` of ``text`` (UTF-8)."""
    return write_bytes_atomic(path, text.encode(), sync=sync)


def _sync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # some filesystems cannot open a folder; the rename is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def file_sha256(path: str | os.PathLike, block: int = 1 << 22) -> str | None:
    """The sha256 of a file's bytes (hex), read ``block`` bytes at a time; None where no file
    is (a checksum compared with a recorded one then differs)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(block):
                digest.update(chunk)
    except FileNotFoundError:
        return None
    return digest.hexdigest()
