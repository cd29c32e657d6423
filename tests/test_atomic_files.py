"""fedmf.atomic_files: whole files or none under the final name, exact permissions, fsynced journals."""

import os
import stat

import pytest

from fedmf import atomic_files


def _mode(path):
  return stat.S_IMODE(os.stat(path).st_mode)


def test_write_text_replaces_the_file_and_leaves_no_temporary(tmp_path):
  path = tmp_path / "a.json"
  path.write_text("old")
  atomic_files.write_text(path, "new\n")
  assert path.read_text() == "new\n"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_mode_is_exact_whatever_the_umask(tmp_path):
  old = os.umask(0o022)
  try:
    atomic_files.write_bytes(tmp_path / "key", b"secret", mode=0o600)
    atomic_files.write_text(tmp_path / "open", "x")
  finally:
    os.umask(old)
  assert _mode(tmp_path / "key") == 0o600
  assert _mode(tmp_path / "open") == 0o644


def test_a_failure_leaves_the_target_untouched(tmp_path):
  path = tmp_path / "a.txt"
  path.write_text("kept")
  with pytest.raises(RuntimeError):
    with atomic_files.open_atomic(path) as f:
      f.write("half")
      raise RuntimeError("interrupted")
  assert path.read_text() == "kept"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def test_write_files_renames_none_when_one_fails(tmp_path, monkeypatch):
  (tmp_path / "a").write_text("old a")
  real = os.fsync
  calls = []

  def flaky(fd):
    calls.append(fd)
    if len(calls) == 2:
      raise OSError(28, "No space left on device")
    return real(fd)

  monkeypatch.setattr(os, "fsync", flaky)
  with pytest.raises(OSError):
    atomic_files.write_files({tmp_path / "a": b"new a", tmp_path / "b": b"new b"})
  assert (tmp_path / "a").read_text() == "old a"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_partial_path_for_writers_that_need_a_name(tmp_path):
  with atomic_files.partial_path(tmp_path / "db") as tmp:
    assert tmp.name.startswith(".db.tmp-")
    tmp.write_bytes(b"rows")
  assert (tmp_path / "db").read_bytes() == b"rows"
  with pytest.raises(ValueError):
    with atomic_files.partial_path(tmp_path / "db") as tmp:
      tmp.write_bytes(b"half")
      raise ValueError
  assert (tmp_path / "db").read_bytes() == b"rows"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["db"]


def test_partial_file_commit_and_abort(tmp_path):
  part = atomic_files.PartialFile(tmp_path / "m.csv", tag="partial", encoding="utf-8")
  assert part.partial.name.startswith(".m.csv.partial-")
  part.file.write("a,b\n")
  assert not (tmp_path / "m.csv").exists()  # Only under its final name once committed.
  part.commit()
  assert (tmp_path / "m.csv").read_text() == "a,b\n"
  gone = atomic_files.PartialFile(tmp_path / "n.csv")
  gone.file.write(b"x")
  gone.abort()
  kept = atomic_files.PartialFile(tmp_path / "k.csv", keep=True)
  kept.abort()
  assert sorted(p.name for p in tmp_path.iterdir()) == [kept.partial.name, "m.csv"]


def test_journal_writes_its_header_once_and_appends(tmp_path):
  path = tmp_path / "journal.csv"
  j = atomic_files.Journal(path, "round,sha256\n")
  j.append("0,aa\n")
  j.close()
  j = atomic_files.Journal(path, "round,sha256\n")  # Reopened: no second header.
  j.append("1,bb\n")
  j.close()
  assert path.read_text() == "round,sha256\n0,aa\n1,bb\n"


def test_fsync_path_syncs_the_file_and_its_directory(tmp_path, monkeypatch):
  import stat

  path = tmp_path / "metrics.csv"
  path.write_text("round\n0\n")
  synced = []
  real = os.fsync

  def recording(fd):
    synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
    real(fd)

  monkeypatch.setattr(os, "fsync", recording)
  atomic_files.fsync_path(path)
  assert synced == [False, True]  # The file's data, then the directory entry (a rename).
  with pytest.raises(FileNotFoundError):
    atomic_files.fsync_path(tmp_path / "missing.csv")
