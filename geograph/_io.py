"""Artefact files (saved graphs, projections): atomic writes and one-line read errors naming the file.

A file is written under a temporary name in its own directory, flushed to disk and renamed
over the final name (``os.replace``, atomic on POSIX and Windows): a reader, or a save killed
half-way, never sees a partial file under the final name. A directory of several files is made
loadable last: its metadata file is removed first and written back last, so a killed save
leaves a directory that does not load rather than one that mixes two saves.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch

__all__ = [
    "atomic_save",
    "atomic_write",
    "atomic_write_json",
    "atomic_torch_save",
    "read_json",
    "read_torch",
    "check_file_size",
    "one_line",
    "replace_directory",
]

PathLike = str | Path


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's message on one line (its type name if it has none), shortened."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError, AttributeError):  # not possible on every OS / file system
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_save(path: PathLike, save: Callable[[Path], None]) -> Path:
    """Call ``save(tmp)`` with a new, empty temporary file ``tmp`` next to ``path`` (for a writer
    that takes a file name), fsync it, rename it to ``path``.

    The temporary file is created with the usual permissions (``0o666`` less the umask), so
    the result is readable like any file the process writes. On an error the temporary file
    is removed and the error re-raised; ``path`` is untouched.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666))
    try:
        mode = tmp.stat().st_mode & 0o777
        save(tmp)
        if tmp.stat().st_mode & 0o777 != mode:  # a writer that replaced the file with its own (private) one
            os.chmod(tmp, mode)
        fd = os.open(tmp, os.O_RDWR | getattr(os, "O_BINARY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)
    return path


def atomic_write(path: PathLike, write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write(f)`` on a temporary file next to ``path``, then fsync and rename it as :func:`atomic_save`."""

    def save(tmp: Path) -> None:
        with tmp.open("wb") as f:
            write(f)

    return atomic_save(path, save)


def atomic_torch_save(obj: Any, path: PathLike) -> int:
    """``torch.save(obj)`` to ``path`` atomically; returns the file's size in bytes."""
    atomic_write(path, lambda f: torch.save(obj, f))
    return os.path.getsize(path)


def atomic_write_json(obj: Any, path: PathLike) -> Path:
    data = json.dumps(obj, indent=2).encode()
    return atomic_write(path, lambda f: f.write(data))


def read_json(path: PathLike) -> dict[str, Any]:
    """A JSON object from ``path``; a missing, truncated or non-object file is a one-line ``ValueError``."""
    path = Path(path)
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(
            f"{path}: cannot read it as JSON (truncated or not written by geograph?): {one_line(e)}"
        ) from e
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(meta).__name__}")
    return meta


def check_file_size(path: PathLike, expected: int | None, meta_file: PathLike) -> None:
    """``path`` exists and, when the metadata recorded its size, has exactly that many bytes."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: file not found (listed in {Path(meta_file).name})")
    if expected is not None:
        size = path.stat().st_size
        if size != int(expected):
            raise ValueError(
                f"{path}: {size} bytes, {Path(meta_file).name} says {int(expected)} "
                "(truncated, or overwritten by another save)"
            )


def read_torch(path: PathLike, map_location: str | torch.device | None = None) -> Any:
    """``torch.load(path, weights_only=True)``; an unreadable file is a one-line ``ValueError`` naming it."""
    path = Path(path)
    try:
        return torch.load(path, map_location=map_location or "cpu", weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"{path}: file not found") from None
    except Exception as e:  # noqa: BLE001 - torch raises RuntimeError, EOFError, UnpicklingError, ... on bad files
        raise ValueError(f"{path}: cannot read it (truncated or not written by geograph?): {one_line(e)}") from e


_RENAME_EXCHANGE = 2  # linux/fs.h


def _exchange(a: Path, b: Path) -> bool:
    """Swap the paths ``a`` and ``b`` in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``);
    ``False`` where the system or the file system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: not supported here
        return False
    raise OSError(err, f"cannot swap {a} and {b}: {os.strerror(err)}")


def replace_directory(new: PathLike, target: PathLike) -> Path:
    """Put the directory ``new`` in the place of ``target`` (a sibling of it), then remove the old one.

    Where ``target`` exists, the two are exchanged in one atomic step on Linux
    (``renameat2(RENAME_EXCHANGE)``): a reader or a crash sees the old directory or the new one,
    never neither. Elsewhere the old directory is first renamed aside, then ``new`` renamed into
    place: a crash between the two renames leaves the old version under ``.<name>.old-*`` beside it.
    """
    new, target = Path(new), Path(target)
    _fsync_dir(new)
    if not target.exists():
        os.replace(new, target)
    elif _exchange(new, target):
        shutil.rmtree(new, ignore_errors=True)  # (the old version, now under new's name)
    else:
        aside = target.with_name(f".{target.name}.old-{os.getpid()}.{secrets.token_hex(4)}")
        os.replace(target, aside)
        os.replace(new, target)
        shutil.rmtree(aside, ignore_errors=True)
    _fsync_dir(target.parent)
    return target
