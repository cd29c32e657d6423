#!/usr/bin/env python3
"""Are fedmf's outputs unchanged? Records what a fixed set of commands prints and writes, and
compares two records byte for byte, except ids, paths and times (issue 39's acceptance check for
a refactor).

The commands, all with fixed seeds on tiny inputs: every `--help` (the whole parser tree),
`strategy optimize` and `strategy evaluate`, `account` (σ for ε and ε for σ, both accountants),
`simulate` (a timer run and a cyclic-Poisson run), `audit --json` (of a run directory and of a
bare log), and `train` (then resumed, which must release nothing new). Their stdout, stderr,
exit codes and every file they write (text normalized, binary by content hash) go into one
directory per record.

  .venv/bin/python tools/outputs_unchanged.py record /tmp/before      # on the old code
  .venv/bin/python tools/outputs_unchanged.py record /tmp/after       # on the new code
  .venv/bin/python tools/outputs_unchanged.py compare /tmp/before /tmp/after

`record --source DIR` runs the fedmf package of another checkout (e.g. a `git worktree` of main)
with this environment's interpreter. A record takes about 3 minutes on 2 idle cores.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TINY = [
  "task=synthetic",
  "num_clients=60",
  "vocab_size=40",
  "rounds=6",
  "clients_per_round=4",
  "max_sentences_per_client=16",
  "test_sentences=64",
  "eval_every=3",
  "seed=3",
  "noise_seed=5",
  "reference_clients_per_round=100",
  "participation.min_sep=2",
  "target_epsilon=8",
]
CYCLIC = [
  "participation.model=cyclic-poisson",
  "clients_per_round=8",
  "participation.partitions=2",
  "participation.sampling_probability=0.25",
  "participation.min_sep=null",
  "mechanism=bandmf",
  "bands=2",
]
TEXT_SUFFIXES = {".json", ".csv", ".md", ".html", ".txt", ".yaml", ".jsonl", ".svg", ""}

# What may differ between two runs of the same code: times, durations, ids, versions of the
# process (pids), paths of temporary directories (replaced before these), base64 images (hashed).
NORMALIZE = [
  (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:?\d\d)?"), "<TIME>"),
  (re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d(:\d\d)?( UTC)?"), "<TIME>"),
  (
    re.compile(
      r'"(started|finished|created|updated|time|wall_seconds|seconds|elapsed_s|'
      r'[a-z_]*_seconds|[a-z_]*_s|pid|host|hostname|run_id|id)": [^,}\n]+'
    ),
    r'"\1": <X>',
  ),
  (re.compile(r"\b[0-9a-f]{32,64}\b"), "<HEX>"),
  (re.compile(r"\b\d+(\.\d+)?\s?(s|ms|min|seconds)\b"), "<DUR>"),
  (re.compile(r"\b\d+:\d\d(:\d\d)?\b"), "<CLOCK>"),
  (re.compile(r"data:image/png;base64,[A-Za-z0-9+/=]+"), "<PNG>"),
  # TensorBoard event files are named by time, host and pid, and hold wall times.
  (re.compile(r"events\.out\.tfevents\.[\w.-]+"), "events.out.tfevents.<X>"),
]
TIME_COLUMNS = ("round_seconds", "seconds")


def normalize_csv(text: str) -> str:
  """A CSV with its time columns (TIME_COLUMNS) blanked: wall-clock measurements, not outputs."""
  lines = text.split("\n")
  header = lines[0].split(",")
  drop = {i for i, name in enumerate(header) if name in TIME_COLUMNS}
  if not drop:
    return text
  out = [lines[0]]
  for line in lines[1:]:
    cells = line.split(",")
    out.append(",".join("<X>" if i in drop and c else c for i, c in enumerate(cells)))
  return "\n".join(out)


SOURCE = [str(ROOT)]  # The checkout whose fedmf runs (record --source), named <REPO>.


def normalize(text: str, tmp: str) -> str:
  text = text.replace(tmp, "<TMP>").replace(SOURCE[0], "<REPO>").replace(str(ROOT), "<REPO>")
  for pattern, replacement in NORMALIZE:
    text = pattern.sub(replacement, text)
  return text


def help_commands(python: str, env: dict) -> list[list[str]]:
  """Every parser of the tree, found by walking `fedmf.cli.main.build_parser()`."""
  code = (
    "import argparse, json\n"
    "from fedmf.cli import main\n"
    "def walk(p, path):\n"
    "  yield path\n"
    "  for a in p._actions:\n"
    "    if isinstance(a, argparse._SubParsersAction):\n"
    "      for name, sub in a.choices.items():\n"
    "        yield from walk(sub, path + [name])\n"
    "print(json.dumps(list(walk(main.build_parser(), []))))\n"
  )
  out = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, check=True)
  return [path + ["--help"] for path in json.loads(out.stdout)]


def record(dest: Path, source: Path) -> None:
  python = sys.executable
  dest.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(prefix="fedmf-outputs-") as tmp:
    env = dict(os.environ)
    env.update(
      PYTHONPATH=str(source),
      COLUMNS="100",
      PYTHONHASHSEED="0",
      FEDMF_CACHE_DIR=os.path.join(tmp, "cache"),
      TZ="UTC",
    )
    env.pop("FEDMF_DEBUG", None)
    work = Path(tmp)
    index = []

    def run(name: str, argv: list[str], outputs: Path | None = None) -> None:
      proc = subprocess.run(
        [python, "-c", "import sys; from fedmf.cli.main import main; sys.exit(main())", *argv],
        env=env,
        capture_output=True,
        text=True,
        cwd=work,
      )
      entry = {
        "name": name,
        "argv": normalize(" ".join(argv), tmp),
        "exit": proc.returncode,
        "stdout": normalize(proc.stdout, tmp),
        "stderr": normalize(proc.stderr, tmp),
      }
      index.append(name)
      (dest / f"{name}.cmd.json").write_text(json.dumps(entry, indent=1, sort_keys=True) + "\n")
      if outputs is not None and outputs.exists():
        files = sorted(p for p in outputs.rglob("*") if p.is_file())
        listing = {}
        for path in files:
          rel = normalize(str(path.relative_to(outputs)), tmp)
          data = path.read_bytes()
          if "tfevents" in path.name:
            listing[rel] = "<tensorboard events: wall times inside>"
            continue
          if path.suffix in TEXT_SUFFIXES:
            try:
              text = normalize(data.decode(), tmp)
              listing[rel] = normalize_csv(text) if path.suffix == ".csv" else text
              continue
            except UnicodeDecodeError:
              pass
          listing[rel] = f"<binary sha256 {hashlib.sha256(data).hexdigest()[:16]}>"
        (dest / f"{name}.files.json").write_text(json.dumps(listing, indent=1, sort_keys=True))
      print(f"  {name}: exit {proc.returncode}", file=sys.stderr)

    for i, argv in enumerate(help_commands(python, env)):
      run(f"help-{i:02d}-{'-'.join(argv[:-1]) or 'fedmf'}", argv)

    blt = work / "blt.json"
    run(
      "strategy-optimize-blt",
      [
        "strategy",
        "optimize",
        "--mechanism",
        "blt",
        "--n",
        "12",
        "--min-sep",
        "3",
        "--max-participations",
        "4",
        "--buffers",
        "2",
        "--seed",
        "1",
        "--out",
        str(blt),
        "--json",
        "--no-progress",
      ],
    )
    band = work / "bandmf.json"
    run(
      "strategy-optimize-bandmf-auto",
      [
        "strategy",
        "optimize",
        "--mechanism",
        "bandmf",
        "--n",
        "12",
        "--min-sep",
        "3",
        "--max-participations",
        "4",
        "--bands",
        "auto",
        "--target-epsilon",
        "4",
        "--delta",
        "1e-6",
        "--dataset-size",
        "400",
        "--batch-size",
        "100",
        "--out",
        str(band),
        "--json",
        "--no-progress",
      ],
    )
    for name, path in (("blt", blt), ("bandmf", band)):
      run(
        f"strategy-evaluate-{name}",
        [
          "strategy",
          "evaluate",
          str(path),
          "--n",
          "12",
          "--min-sep",
          "3",
          "--max-participations",
          "4",
          "--json",
        ],
      )
      run(
        f"strategy-evaluate-{name}-text",
        [
          "strategy",
          "evaluate",
          str(path),
          "--n",
          "12",
          "--min-sep",
          "3",
          "--max-participations",
          "4",
        ],
      )
    for accountant in ("pld", "analytic"):
      run(
        f"account-sigma-{accountant}",
        [
          "account",
          str(blt),
          "--n",
          "12",
          "--min-sep",
          "3",
          "--noise-multiplier",
          "2",
          "--delta",
          "1e-6",
          "--accountant",
          accountant,
          "--json",
        ],
      )
      run(
        f"account-eps-{accountant}",
        [
          "account",
          str(blt),
          "--n",
          "12",
          "--min-sep",
          "3",
          "--target-epsilon",
          "5",
          "--delta",
          "1e-6",
          "--accountant",
          accountant,
        ],
      )
    run(
      "account-default",
      [
        "account",
        str(blt),
        "--n",
        "12",
        "--min-sep",
        "3",
        "--noise-multiplier",
        "2",
        "--delta",
        "1e-6",
      ],
    )
    run(
      "account-amplified",
      [
        "account",
        str(band),
        "--n",
        "12",
        "--min-sep",
        "3",
        "--target-epsilon",
        "4",
        "--delta",
        "1e-6",
        "--dataset-size",
        "400",
        "--batch-size",
        "100",
        "--json",
      ],
    )

    def sets(items):
      # A later item replaces an earlier one of the same key (a key given twice is refused).
      latest = {item.partition("=")[0]: item for item in items}
      return [arg for item in latest.values() for arg in ("--set", item)]

    for name, extra in (("timer", []), ("cyclic", CYCLIC)):
      out = work / f"sim-{name}"
      run(
        f"simulate-{name}",
        ["simulate", "--out", str(out), "--no-progress", "--json", *sets(TINY + extra)],
        outputs=out,
      )
      run(f"audit-{name}-run-json", ["audit", str(out), "--json"])
      run(
        f"audit-{name}-log-json",
        [
          "audit",
          str(out / "participation.csv"),
          "--strategy",
          str(out / "strategy.json"),
          "--noise-multiplier",
          "1.5",
          "--delta",
          "1e-6",
          "--rounds",
          "6",
          "--min-sep",
          "2",
          "--json",
        ],
      )
      report = work / f"report-{name}"
      run(f"audit-{name}-run-report", ["audit", str(out), "--report", str(report)], outputs=report)
    prog = work / "prog"
    train_args = [
      "train",
      "--root",
      str(prog),
      "--no-progress",
      "--json",
      *sets(TINY + ["checkpoint_every=2"]),
    ]
    run("train", train_args, outputs=prog)
    run("train-resume", train_args, outputs=prog)
    run("audit-train-json", ["audit", str(prog), "--json"])
    (dest / "index.json").write_text(json.dumps(index, indent=1) + "\n")


def _renormalized(record):
  """A stored record normalized again with the current rules (records of older versions of this
  script compare equal when only what these rules drop differs)."""
  if not isinstance(record, dict) or "argv" in record:
    return record
  out = {}
  for key, value in record.items():
    key = normalize(key, "\0")
    if "tfevents" in key:
      value = "<tensorboard events: wall times inside>"
    elif key.endswith(".csv") and isinstance(value, str):
      value = normalize_csv(value)
    elif isinstance(value, str):
      value = normalize(value, "\0")
    out[key] = value
  return out


def compare(before: Path, after: Path) -> int:
  names = sorted({p.name for p in before.iterdir()} | {p.name for p in after.iterdir()})
  differ = 0
  for name in names:
    a, b = before / name, after / name
    if not a.exists() or not b.exists():
      print(f"only in {'after' if b.exists() else 'before'}: {name}")
      differ += 1
      continue
    if a.read_bytes() == b.read_bytes():
      continue
    left, right = _renormalized(json.loads(a.read_text())), _renormalized(json.loads(b.read_text()))
    if left == right:
      continue
    differ += 1
    print(f"differs: {name}")
    if isinstance(left, dict):
      for key in sorted(set(left) | set(right)):
        if left.get(key) != right.get(key):
          la = str(left.get(key, "<absent>")).splitlines()
          lb = str(right.get(key, "<absent>")).splitlines()
          diff = list(
            difflib.unified_diff(la, lb, f"before/{key}", f"after/{key}", lineterm="", n=1)
          )
          print("\n".join(diff[:40]))
  print(f"{len(names) - differ} of {len(names)} records identical; {differ} differ")
  return 1 if differ else 0


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  sub = parser.add_subparsers(dest="command", required=True)
  rec = sub.add_parser("record", help="run the commands and record their outputs in DIR")
  rec.add_argument("dir", type=Path)
  rec.add_argument("--source", type=Path, default=ROOT, help="checkout whose fedmf to run")
  cmp_ = sub.add_parser("compare", help="compare two records; exit 1 if any differs")
  cmp_.add_argument("before", type=Path)
  cmp_.add_argument("after", type=Path)
  args = parser.parse_args()
  if args.command == "record":
    if args.dir.exists():
      shutil.rmtree(args.dir)
    SOURCE[0] = str(args.source.resolve())
    record(args.dir, args.source.resolve())
    return 0
  return compare(args.before, args.after)


if __name__ == "__main__":
  sys.exit(main())
