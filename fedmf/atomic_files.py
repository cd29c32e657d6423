"""Atomic files and fsynced journals: the one place fedmf writes a file that must not be torn.

One concept: a file appears under its final name whole or not at all, and survives a crash once
written. A file is written under a hidden temporary name next to its target
(`.<name>.<tag>-<pid>`, same directory so the rename stays in one file system), fsynced, renamed
over the target (`os.replace`, atomic on POSIX) and the directory fsynced (the rename itself
durable). On any failure, an interrupt included, the temporary file is removed and the target is
untouched.

* `write_bytes` / `write_text`: a whole file at once; `write_files`: several, all renamed only once
  every one is written.
* `partial_path`: a temporary path for writers that need a path (sqlite), replaced on success.
* `PartialFile`: a file written over time (a log, a CSV), published by `commit()`, removed by
  `abort()`; optionally removed on SIGTERM too (whose default action skips `finally` blocks).
* `Journal`: a file living under its final name that grows by fsynced appends.

`mode` (e.g. 0o600 for files holding seeds or keys) sets the permissions exactly, whatever the
umask; without it a file gets the usual `open()` permissions. Layer 0: standard library only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import weakref
from pathlib import Path
from typing import IO, Iterator, Mapping, Optional, Union

PathLike = Union[str, "os.PathLike[str]"]


def temporary_name(path: PathLike, tag: str = "tmp") -> Path:
  """The hidden temporary file next to `path` that this process writes it through."""
  path = Path(path)
  return path.with_name(f".{path.name}.{tag}-{os.getpid()}")


def fsync_directory(directory: PathLike) -> None:
  """Makes a rename in `directory` durable (best effort: some file systems refuse a directory)."""
  try:
    fd = os.open(directory, os.O_RDONLY)
  except OSError:
    return
  try:
    os.fsync(fd)
  except OSError:
    pass
  finally:
    os.close(fd)


def fsync_path(path: PathLike) -> None:
  """Makes a file written by someone else's code durable: its data and its directory entry (it
  may have been renamed into place)."""
  path = Path(path)
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)
  fsync_directory(path.parent)


def _open(tmp: Path, binary: bool, mode: Optional[int], encoding: str, newline: Optional[str]):
  if mode is None:
    return open(tmp, "wb") if binary else open(tmp, "w", encoding=encoding, newline=newline)
  fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
  try:
    os.fchmod(fd, mode)  # Exactly `mode`: neither the umask nor a stale file's bits.
    return os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding=encoding, newline=newline)
  except BaseException:
    os.close(fd)
    raise


def _unlink(path: Path) -> None:
  try:
    os.unlink(path)
  except OSError:
    pass


def _publish(tmp: Path, path: Path) -> None:
  os.replace(tmp, path)
  fsync_directory(path.parent)


def _sync(f: IO) -> None:
  f.flush()
  os.fsync(f.fileno())


@contextlib.contextmanager
def open_atomic(
  path: PathLike,
  binary: bool = False,
  *,
  mode: Optional[int] = None,
  tag: str = "tmp",
  encoding: str = "utf-8",
  newline: Optional[str] = None,
) -> Iterator[IO]:
  """A file object to write `path` through: published when the block ends, removed if it raises."""
  path = Path(path)
  tmp = temporary_name(path, tag)
  try:
    with _open(tmp, binary, mode, encoding, newline) as f:
      yield f
      _sync(f)
    _publish(tmp, path)
  finally:
    _unlink(tmp)  # Gone after the rename; left by a failure or an interrupt.


def write_bytes(
  path: PathLike, data: bytes, *, mode: Optional[int] = None, tag: str = "tmp"
) -> None:
  """`data` as the whole content of `path`, atomically and durably."""
  with open_atomic(path, True, mode=mode, tag=tag) as f:
    f.write(data)


def write_text(
  path: PathLike,
  text: str,
  *,
  mode: Optional[int] = None,
  tag: str = "tmp",
  encoding: str = "utf-8",
  newline: Optional[str] = None,
) -> None:
  """`text` as the whole content of `path`, atomically and durably."""
  with open_atomic(path, mode=mode, tag=tag, encoding=encoding, newline=newline) as f:
    f.write(text)


def write_files(files: Mapping[PathLike, bytes], *, tag: str = "tmp") -> None:
  """Several files, each written and fsynced under its temporary name before any is renamed: a
  failure while writing leaves none of them changed."""
  staged: list[tuple[Path, Path]] = []
  try:
    for path, data in files.items():
      path = Path(path)
      staged.append((temporary_name(path, tag), path))
      with _open(staged[-1][0], True, None, "utf-8", None) as f:
        f.write(data)
        _sync(f)
    for tmp, path in staged:
      os.replace(tmp, path)
    for directory in {path.parent for _, path in staged}:
      fsync_directory(directory)
  finally:
    for tmp, _ in staged:
      _unlink(tmp)


@contextlib.contextmanager
def partial_path(path: PathLike, *, tag: str = "tmp") -> Iterator[Path]:
  """A temporary path for a writer that opens files by name (sqlite); when the block ends the file
  is fsynced and renamed over `path`, if it raises the file is removed."""
  path = Path(path)
  tmp = temporary_name(path, tag)
  try:
    yield tmp
    fd = os.open(tmp, os.O_RDONLY)
    try:
      os.fsync(fd)
    finally:
      os.close(fd)
    _publish(tmp, path)
  finally:
    _unlink(tmp)


# Partial files removed on SIGTERM. Its default action kills the process without running `finally`
# blocks or `__exit__`, which would leave `.<name>.<tag>-<pid>` behind; while such a file is open
# (and nobody else handles SIGTERM) a handler removes them, then lets the default action end the
# process. A program that handles SIGTERM itself (the fedmf CLI raises an exception) removes them
# through its own exit path (`abort`).
_WATCHED: "weakref.WeakSet[PartialFile]" = weakref.WeakSet()
_SIGTERM_INSTALLED = False


def _remove_partials_and_terminate(signum, frame):  # pylint: disable=unused-argument
  for partial in list(_WATCHED):
    partial.remove()
  signal.signal(signum, signal.SIG_DFL)
  os.kill(os.getpid(), signum)


def _watch_sigterm() -> None:
  """Installs the cleanup handler if SIGTERM has its default action (main thread only)."""
  global _SIGTERM_INSTALLED
  if _SIGTERM_INSTALLED or threading.current_thread() is not threading.main_thread():
    return
  if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
    signal.signal(signal.SIGTERM, _remove_partials_and_terminate)
    _SIGTERM_INSTALLED = True


def _unwatch_sigterm() -> None:
  """Restores the default action once no watched file is open (if the handler is still ours)."""
  global _SIGTERM_INSTALLED
  if not _SIGTERM_INSTALLED or _WATCHED:
    return
  if threading.current_thread() is not threading.main_thread():
    return
  if signal.getsignal(signal.SIGTERM) is _remove_partials_and_terminate:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
  _SIGTERM_INSTALLED = False


class PartialFile:
  """A file written over time under its temporary name: `commit()` publishes it (fsync, rename,
  directory fsync), `abort()` closes it and removes it unless `keep`.

  `file` is the open binary file, or text file with `encoding`. `fsync=False` skips the file's
  fsync on commit (a file whose loss in a crash costs nothing). `sigterm`: removed on SIGTERM too.
  """

  def __init__(
    self,
    path: PathLike,
    *,
    tag: str = "tmp",
    encoding: Optional[str] = None,
    keep: bool = False,
    sigterm: bool = False,
    fsync: bool = True,
  ):
    self.path = Path(path)
    self.partial = temporary_name(self.path, tag)
    self._keep = keep
    self._fsync = fsync
    self.file: IO = (
      open(self.partial, "wb") if encoding is None else open(self.partial, "w", encoding=encoding)
    )
    self._watched = sigterm
    if sigterm:
      _WATCHED.add(self)
      _watch_sigterm()

  def commit(self) -> Path:
    if self._fsync:
      _sync(self.file)
    self.file.close()
    os.replace(self.partial, self.path)
    self._forget()
    fsync_directory(self.path.parent)
    return self.path

  def abort(self) -> None:
    try:
      self.file.close()
    except Exception:  # pylint: disable=broad-except
      pass
    self.remove()
    self._forget()

  def remove(self) -> None:
    """Removes the temporary file (unless `keep`); the SIGTERM handler's cleanup."""
    if not self._keep:
      _unlink(self.partial)

  def _forget(self) -> None:
    if self._watched:
      _WATCHED.discard(self)
      _unwatch_sigterm()


class Journal:
  """A text file under its final name that grows by appends, each fsynced before `append` returns
  (a crash never loses a line the program went on from). A missing file is created with `header`
  (fsynced); an existing one is appended to as it is."""

  def __init__(self, path: PathLike, header: str = "", *, newline: Optional[str] = None):
    self.path = Path(path)
    if not self.path.exists():
      with open(self.path, "w", encoding="utf-8", newline=newline) as f:
        f.write(header)
        _sync(f)
    self._file = open(self.path, "a", encoding="utf-8", newline=newline)

  def append(self, text: str) -> None:
    self._file.write(text)
    _sync(self._file)

  def close(self) -> None:
    if not self._file.closed:
      self._file.close()
