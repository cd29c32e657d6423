#!/usr/bin/env python3
"""Regenerates docs/img/report.png, the README's picture, from the demo's own report.

  python3 dev.py demo                      # the README's main job: out/demo/report.html
  python3 tools/readme_screenshot.py       # docs/img/report.png and docs/img/report.json

The picture is the top of out/demo/report.html as headless chromium renders it (the verdict, the
summary, the plain-words paragraphs and the first plots), so it shows what a user sees after the
README's first command, not another run. docs/img/report.json records where it came from: the
run id, the demo's config file and its sha256 (tests/test_readme_commands.py fails when the
default config changed since the picture was made: rerun both commands then).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "out" / "demo"
CONFIG = ROOT / "simulations" / "configs" / "default.yaml"
PNG = ROOT / "docs" / "img" / "report.png"
RECORD = ROOT / "docs" / "img" / "report.json"
# The browser window: the report's text column is about 1000 pixels wide; the picture keeps the
# first HEIGHT pixels (the verdict, the summary, the plain words and the first plot).
WIDTH, HEIGHT = 1100, 2200


def config_sha256() -> str:
  return hashlib.sha256(CONFIG.read_bytes()).hexdigest()


def main() -> int:
  report, summary = DEMO / "report.html", DEMO / "summary.json"
  if not report.is_file() or not summary.is_file():
    print(f"readme_screenshot: no demo run in {DEMO}: run `python3 dev.py demo` first")
    return 2
  run = json.loads((DEMO / "run.json").read_text())
  config = json.loads((DEMO / "config.json").read_text())
  browser = shutil.which("chromium") or shutil.which("chromium-browser")
  if browser is None:
    print("readme_screenshot: chromium is not installed (Debian: apt-get install chromium)")
    return 2
  with tempfile.TemporaryDirectory() as profile:
    shot = Path(profile) / "shot.png"
    subprocess.run(
      [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        f"--screenshot={shot}",
        f"--window-size={WIDTH},{HEIGHT}",
        report.resolve().as_uri(),
      ],
      check=True,
      capture_output=True,
    )
    PNG.write_bytes(shot.read_bytes())
  RECORD.write_text(
    json.dumps(
      {
        "made_by": "python3 tools/readme_screenshot.py",
        "from": "out/demo/report.html of `python3 dev.py demo`",
        "run_id": run["run_id"],
        "config": CONFIG.relative_to(ROOT).as_posix(),
        "config_sha256": config_sha256(),
        "mechanism": config.get("mechanism"),
        "rounds": config.get("rounds"),
      },
      indent=2,
    )
    + "\n"
  )
  print(f"wrote {PNG.relative_to(ROOT)} and {RECORD.relative_to(ROOT)} (run {run['run_id']})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
