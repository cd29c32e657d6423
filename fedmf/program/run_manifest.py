"""run.json: which run a directory's files come from, and whether that run finished.

One concept: a run directory is trusted only as a whole. Every run (`fedmf simulate`, `fedmf train`)
has a run id; its JSON files carry it (`run_id`), and run.json lists every file of the finished run
with its sha256. `check(DIR)` (called by `fedmf audit DIR` through `fedmf.program.run_dir`) refuses
a directory whose files come from different runs or from an unfinished one, so an audit can never
account one run's participation log with another run's noise multiplier (issue 26, A.1).

`fedmf simulate` writes into a staging directory beside OUT (`Staging`) and moves it into place
only when the run has finished: an interrupted run leaves the earlier run in OUT as it was. A
staging directory left behind by a killed process says, in its run.json, what it is.

Only the standard library: no TensorFlow, so `fedmf audit` stays light.
"""

from __future__ import annotations

import ctypes
import datetime
import errno
import hashlib
import json
import os
import secrets
import shutil
import socket
from pathlib import Path
from typing import Any, Optional

from fedmf.errors import FedmfUserError

MANIFEST = "run.json"
FORMAT = 1
STAGING_INFIX = ".staging-"
# Files an audit reads: present but not the finished run's = another run's file.
AUDITED_FILES = (
  "plan.json",
  "strategy.json",
  "summary.json",
  "config.json",
  "participation.csv",
  "participation.csv.gz",
  "participation.jsonl",
  "participation.jsonl.gz",
  "participation.parquet",
  "canaries.npz",
)
# Not hashed: the lock, checkpoints (they change on every resume and hold secrets), temporaries.
_UNHASHED_DIRS = ("state",)


class RunManifestError(FedmfUserError):
  """A run directory that cannot be trusted as one finished run (one line saying what to do)."""


def new_run_id() -> str:
  """A time-ordered, unique id: 20261127T045500Z-1a2b3c4d."""
  now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
  return f"{now}-{secrets.token_hex(4)}"


def _now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def sha256_file(path: Path) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def run_files(directory: Path) -> list[str]:
  """The run's files (relative POSIX paths), without run.json, the lock, checkpoints, dotfiles."""
  found = []
  for path in sorted(Path(directory).rglob("*")):
    rel = path.relative_to(directory)
    if not path.is_file() or rel.parts[0] in _UNHASHED_DIRS or rel.as_posix() == MANIFEST:
      continue
    if any(part.startswith(".") for part in rel.parts):
      continue
    found.append(rel.as_posix())
  return found


def _write(path: Path, obj: dict[str, Any]) -> None:
  from fedmf.program import outputs  # pylint: disable=g-import-not-at-top

  outputs.write_json(path, obj)


def read(directory: Path) -> Optional[dict[str, Any]]:
  """run.json of `directory` (None when absent); a broken one is refused."""
  path = Path(directory) / MANIFEST
  if not path.is_file():
    return None
  try:
    obj = json.loads(path.read_text(encoding="utf-8"))
  except (OSError, UnicodeDecodeError, ValueError) as e:
    raise RunManifestError(f"{path}: not a readable run manifest ({type(e).__name__})") from None
  if not isinstance(obj, dict) or not isinstance(obj.get("run_id"), str):
    raise RunManifestError(f"{path}: not a fedmf run manifest (no run_id)")
  return obj


def start(directory: Path, command: str, run_id: str, **extra: Any) -> dict[str, Any]:
  """Marks `directory` as holding run `run_id` in progress (written before any other file)."""
  manifest = {
    "format": FORMAT,
    "run_id": run_id,
    "command": command,
    "state": "running",
    "started": _now(),
    "pid": os.getpid(),
    "host": socket.gethostname(),
    **extra,
  }
  _write(Path(directory) / MANIFEST, manifest)
  return manifest


def finish(directory: Path, manifest: dict[str, Any]) -> dict[str, Any]:
  """Marks the run finished, listing every file with its sha256 (written after every other file)."""
  directory = Path(directory)
  done = dict(manifest)
  done.update(
    state="finished",
    finished=_now(),
    files={name: sha256_file(directory / name) for name in run_files(directory)},
  )
  _write(directory / MANIFEST, done)
  return done


def _pid_alive(pid: Any, host: Any) -> Optional[bool]:
  """Whether process `pid` still runs (None: another host, cannot tell)."""
  if host != socket.gethostname() or not isinstance(pid, int):
    return None
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def _logged_rounds(directory: Path) -> Optional[int]:
  path = directory / "metrics.csv"
  partial = sorted(directory.glob(".metrics.csv.partial-*"))
  path = partial[0] if partial else path
  if not path.is_file():
    return None
  with open(path, "rb") as f:
    return max(0, sum(1 for line in f if line.endswith(b"\n")) - 1)


def _unfinished_message(directory: Path, manifest: dict[str, Any]) -> str:
  run_id, started = manifest.get("run_id"), manifest.get("started", "?")
  alive = _pid_alive(manifest.get("pid"), manifest.get("host"))
  rounds = _logged_rounds(directory)
  done = "" if rounds is None else f", {rounds} rounds done"
  if manifest.get("command") == "train":
    if alive:
      return (
        f"{directory} holds the fedmf train run {run_id} still running (pid {manifest['pid']}"
        f"{done}): audit it when it has finished"
      )
    return (
      f"{directory} holds the unfinished fedmf train run {run_id} (started {started}{done}; "
      f"stopped before its end): rerun the same `fedmf train --root {directory}` command to "
      "resume and finish it, then audit"
    )
  target = manifest.get("target", "?")
  if alive:
    return (
      f"{directory} is the staging directory of a fedmf simulate run still running (pid "
      f"{manifest['pid']}, run {run_id}{done}); it becomes {target} when it has finished"
    )
  how = "was killed" if alive is False else "did not finish (another host: cannot tell whether "
  how += "" if alive is False else "it still runs)"
  return (
    f"{directory} is what an interrupted fedmf simulate run left (run {run_id}, started "
    f"{started}{done}; the process {how}): it is not a run and {target} was not changed; "
    f"delete it (rm -r {directory}) and rerun fedmf simulate --out {target}"
  )


def check(directory: str | Path) -> Optional[str]:
  """Refuses a directory that is not one finished run; returns a note for a run without run.json.

  Raises RunManifestError: unfinished run, staging directory, a file missing, changed after the
  run finished, or an audited file that is not the run's (another run's).
  """
  directory = Path(directory)
  manifest = read(directory)
  if manifest is None:
    ids = {_json_run_id(directory / name) for name in AUDITED_FILES if name.endswith(".json")}
    ids.discard(None)
    if ids or STAGING_INFIX in directory.name:
      raise RunManifestError(
        f"{directory} has files of run {', '.join(sorted(ids)) or '?'} but no {MANIFEST}: the "
        "run did not finish, or its files were copied without it; not audited"
      )
    return (
      f"{directory} has no {MANIFEST} (written by fedmf before issue 26): its files could not be "
      "checked to come from one finished run"
    )
  run_id = manifest["run_id"]
  if manifest.get("state") != "finished":
    raise RunManifestError(_unfinished_message(directory, manifest))
  files = manifest.get("files")
  if not isinstance(files, dict):
    raise RunManifestError(f"{directory / MANIFEST}: no file list; not audited")
  for name, digest in sorted(files.items()):
    path = directory / name
    if not path.is_file():
      raise RunManifestError(
        f"{path} is missing: run {run_id} is incomplete (it listed {len(files)} files); not audited"
      )
    if name in AUDITED_FILES and sha256_file(path) != digest:
      raise RunManifestError(
        f"{path} was changed after run {run_id} finished, or comes from another run "
        f"(its sha256 is not the one in {MANIFEST}); not audited"
      )
  for name in AUDITED_FILES:
    if (directory / name).is_file() and name not in files:
      other = _json_run_id(directory / name) if name.endswith(".json") else None
      origin = f"run {other}" if other else "another run"
      raise RunManifestError(
        f"{directory / name} is not a file of run {run_id} ({MANIFEST}) but of {origin}: the "
        "directory mixes runs; not audited"
      )
  return None


def _json_run_id(path: Path) -> Optional[str]:
  if not path.is_file():
    return None
  try:
    obj = json.loads(path.read_text(encoding="utf-8"))
  except (OSError, UnicodeDecodeError, ValueError):
    return None
  value = obj.get("run_id") if isinstance(obj, dict) else None
  return value if isinstance(value, str) else None


def check_train_root(root: Path) -> None:
  """Refuses a `fedmf train --root` holding something other than a train program, before anything
  (a lock included) is written there."""
  root = Path(root)
  if not root.is_dir():
    return
  manifest = read(root)
  if manifest is not None and manifest.get("command") != "train":
    raise RunManifestError(
      f"{root} holds a fedmf {manifest.get('command')} run (run {manifest['run_id']}), not a "
      "fedmf train program: use another --root"
    )
  released = [name for name in ("participation.csv", "metrics.csv") if (root / name).exists()]
  if released and not (root / "state").is_dir():
    raise RunManifestError(
      f"{root} has released rounds ({released[0]}) but no checkpoint (state/): it is not a fedmf "
      "train program, or restarting would release them again with new noise; use another --root"
    )


# ---------------------------------------------------------------------------------------------
# Staging: a run written beside OUT, moved into place when it has finished.


def staging_path(out: Path, run_id: str) -> Path:
  out = Path(os.path.abspath(out))
  return out.with_name(f".{out.name}{STAGING_INFIX}{run_id}")


def leftover_staging(out: Path) -> list[Path]:
  """Staging directories of earlier runs into `out` whose process no longer runs."""
  out = Path(os.path.abspath(out))
  if not out.parent.is_dir():
    return []
  left = []
  for path in sorted(out.parent.glob(f".{out.name}{STAGING_INFIX}*")):
    try:
      manifest = read(path) or {}
    except RunManifestError:
      manifest = {}
    if path.is_dir() and not _pid_alive(manifest.get("pid"), manifest.get("host")):
      left.append(path)
  return left


def leftover_message(path: Path) -> str:
  try:
    manifest = read(path)
  except RunManifestError:
    manifest = None
  if manifest is None:
    return f"{path} is left over from an interrupted fedmf run; delete it (rm -r {path})"
  return _unfinished_message(path, manifest)


def _exchange(a: Path, b: Path) -> bool:
  """Atomically swaps two paths (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
  try:
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = libc.renameat2
  except (OSError, AttributeError):
    return False
  at_fdcwd, rename_exchange = -100, 2
  result = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
  if result == 0:
    return True
  err = ctypes.get_errno()
  if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
    return False
  raise OSError(err, os.strerror(err), str(b))


def replace_dir(staged: Path, out: Path) -> None:
  """Puts the finished run `staged` at `out`, replacing the run there (atomic where possible).

  An empty or absent `out` is replaced by one rename. An earlier run is swapped with the new one
  in one step (renameat2), then deleted; where the swap is not available, it is renamed aside
  first (a crash between the two renames leaves both runs, each whole, and no `out`).
  """
  out = Path(out)
  if not out.exists():
    os.rename(staged, out)
    return
  if out.is_dir() and not any(out.iterdir()):
    os.rename(staged, out)  # rename(2) replaces an empty directory.
    return
  if _exchange(staged, out):
    shutil.rmtree(staged)  # Now the earlier run.
    return
  aside = staged.with_name(staged.name.replace(STAGING_INFIX, ".replaced-"))
  os.rename(out, aside)
  os.rename(staged, out)
  shutil.rmtree(aside)
