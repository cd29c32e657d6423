"""`fedmf audit RUN_DIR` (the run's own settings, overrides reported), `--strict` exit codes, the one
privacy statement a log supports, and `--report` refusals before any work (issue 13)."""

import csv
import json
import os
import shutil
from pathlib import Path

import pytest

from fedmf import display
from fedmf.cli import main as cli_main
from fedmf.mf import strategies
from fedmf.privacy import audit, log_statistics, participation_log
from tests.helpers import one_line_error

BLT = {"mechanism": "blt", "buf_decay": [0.9, 0.5], "output_scale": [0.3, 0.2]}
SIGMA, DELTA, ROUNDS, MIN_SEP = 3.0, 1e-6, 12, 3


def _log_rows(violate: bool, duplicate: bool = False):
  """Clients c0..c5 every MIN_SEP rounds; `violate` makes c0 come back one round early."""
  rows = [(r, f"c{(r % MIN_SEP) * 2 + j}") for r in range(ROUNDS) for j in range(2)]
  if violate:
    rows.append((1, "c0"))
  if duplicate:
    rows.append((4, "c2"))
  rows.sort()
  return [r for r, _ in rows], [c for _, c in rows]


def make_run(
  path: Path, *, violate=False, duplicate=False, sigma=SIGMA, summary=True, strategy=True
):
  """A run directory as fedmf simulate writes it (without training: the audit needs only files)."""
  path.mkdir(parents=True, exist_ok=True)
  participation_log.write_participation_log(
    path / "participation.csv", *_log_rows(violate, duplicate)
  )
  if strategy:
    strategies.save_strategy(strategies.load_strategy(BLT), path / "strategy.json")
  plan = {
    "strategy": "blt (2 buffers)",
    "mechanism": "blt",
    "declared_schema": {"n": ROUNDS, "min_sep": MIN_SEP, "max_participations": 4},
    "noise_multiplier": sigma,
    "training_noise_multiplier": sigma,
    "epsilon": 5.0,
    "delta": DELTA,
    "accounting": "matrix mechanism under ..., PLD",
  }
  (path / "plan.json").write_text(json.dumps(plan))
  (path / "config.json").write_text(json.dumps({"rounds": ROUNDS, "delta": DELTA}))
  if summary:
    (path / "summary.json").write_text(
      json.dumps({"rounds_completed": ROUNDS, "initial_test_accuracy": 0.01})
    )
  metrics = ["round,loss,accuracy,test_loss,refused_checkins,early_admitted"]
  metrics += [
    f"{r},{3 - r / 10},{0.1 + r / 100 if r % 4 == 3 else ''},{3 - r / 20 if r % 4 == 3 else ''},"
    f"{r % 3},0"
    for r in range(ROUNDS)
  ]
  (path / "metrics.csv").write_text("\n".join(metrics) + "\n")
  return path


def _run(capsys, *argv):
  code = cli_main.main(["audit", *map(str, argv)])
  out, err = capsys.readouterr()
  assert "Traceback" not in err
  return code, out, err


def test_run_dir_audit_uses_the_runs_settings_and_equals_the_direct_audit(tmp_path, capsys):
  run = make_run(tmp_path / "run")
  code, out, err = _run(capsys, run, "--json")
  assert code == 0, err
  got = json.loads(out)
  direct = audit.audit_log(
    run / "participation.csv",
    BLT,
    SIGMA,
    DELTA,
    rounds=ROUNDS,
    min_sep=MIN_SEP,
    max_participations=4,
    curve=False,
  )
  assert got["epsilon"] == direct.realized.epsilon and got["noise_multiplier"] == SIGMA
  assert got["rounds"] == ROUNDS and got["rounds_source"] == "given"
  assert got["declared"]["min_sep"] == MIN_SEP and got["declared_holds"] is True
  assert got["privacy_guarantee"] is True and got["strict"] == {"passed": True, "failures": []}
  assert any("settings read from the run directory" in n for n in got["notes"])
  assert got["warnings"] == []  # nothing retyped, nothing inferred


def test_explicit_flags_override_and_the_mismatch_is_reported(tmp_path, capsys):
  run = make_run(tmp_path / "run")
  other = tmp_path / "other.json"
  other.write_text(json.dumps({"mechanism": "dpsgd"}))
  code, out, _ = _run(
    capsys,
    run,
    "--noise-multiplier",
    "1.3",
    "--rounds",
    "20",
    "--strategy",
    other,
    "--min-sep",
    "2",
  )
  assert code == 0
  assert "noise multiplier: 1.3" in out
  assert "warning: --noise-multiplier 1.3 differs from the run's 3" in out
  assert "warning: --rounds 20 differs from the run's 12" in out
  assert "warning: --strategy" in out and "differs from the run's" in out
  assert "warning: --min-sep 2 differs from the run's declared 3" in out
  assert "strategy: dpsgd" in out and "rounds released n: 20" in out
  # The same values as the run's are not a mismatch.
  code, out, _ = _run(capsys, run, "--noise-multiplier", "3", "--delta", "1e-6")
  assert code == 0 and "differs" not in out


def test_a_log_file_needs_the_flags_and_points_at_its_run_directory(tmp_path, capsys):
  run = make_run(tmp_path / "run")
  code, out, err = _run(capsys, run / "participation.csv")
  assert code == 2 and out == ""
  assert "needs --strategy, --noise-multiplier, --delta" in err
  assert f"fedmf audit {run}" in err and len(err.strip().splitlines()) == 1


def test_a_run_without_strategy_json_asks_for_strategy(tmp_path, capsys):
  run = make_run(tmp_path / "run", strategy=False)
  code, _, err = _run(capsys, run)
  assert code == 2 and "strategy.json" in err and "--strategy" in err
  strategy = tmp_path / "blt.json"
  strategy.write_text(json.dumps(BLT))
  assert _run(capsys, run, "--strategy", strategy)[0] == 0


def test_an_unfinished_run_is_audited_over_all_configured_rounds(tmp_path, capsys):
  run = make_run(tmp_path / "run", summary=False)
  code, out, _ = _run(capsys, run, "--json")
  got = json.loads(out)
  assert code == 0 and got["rounds"] == ROUNDS
  assert any("summary.json is missing" in n for n in got["notes"])


@pytest.mark.parametrize(
  "kind, extra, reason",
  [
    ("clean", [], None),
    ("clean", ["--max-epsilon", "1000"], None),
    ("violating", [], "clients violate the declared schema"),
    ("duplicate", [], "duplicate (round, client_id) rows"),
    ("clean", ["--max-epsilon", "0.01"], "exceeds --max-epsilon 0.01"),
    ("no-dp", [], "no privacy guarantee (noise multiplier 0)"),
    ("clean", ["--sensitivity", "lower-bound"], "the sensitivity is a lower bound"),
  ],
)
def test_strict_exit_codes(tmp_path, capsys, kind, extra, reason):
  run = make_run(
    tmp_path / "run",
    violate=kind == "violating",
    duplicate=kind == "duplicate",
    sigma=0.0 if kind == "no-dp" else SIGMA,
  )
  code, out, err = _run(capsys, run, "--strict", *extra)
  if reason is None:
    assert code == 0 and "strict: passed" in err
  else:
    assert code == 1, (out, err)
    assert "fedmf audit: strict: FAILED:" in err and reason in err
  # Without --strict the same audit exits 0 and shows the problem in its output.
  code, out, _ = _run(capsys, run, *extra)
  assert code == 0
  if kind == "violating":
    assert "VIOLATED by the log" in out


def test_strict_in_json_mode(tmp_path, capsys):
  run = make_run(tmp_path / "run", violate=True)
  code, out, _ = _run(capsys, run, "--strict", "--json")
  got = json.loads(out)
  assert code == 1 and got["strict"]["passed"] is False
  assert got["violation_counts"]["min-sep"] == 1


def test_a_violating_log_states_the_realized_guarantee_never_the_declared(tmp_path, capsys):
  run = make_run(tmp_path / "run", violate=True)
  code, out, _ = _run(capsys, run, "--json")
  got = json.loads(out)
  assert code == 0 and got["declared_holds"] is False and got["privacy_guarantee"] is True
  realized, declared = got["epsilon"], got["declared"]["epsilon"]
  assert realized > declared  # c0's early return costs privacy: never under-counted
  statement = got["statement"]
  assert statement.startswith("The log VIOLATES the declared schema")
  assert f"({display.epsilon(realized)}, 1e-06)-DP" in statement  # (rounded up)
  assert f"declared epsilon {display.epsilon(declared)} does NOT hold" in statement
  assert (
    f"({display.epsilon(declared)}," not in statement
  )  # the declared ε is never stated as a guarantee
  assert "min-separation b = 1" in statement  # the realized schema
  # The text summary and the report say the same, in the same words.
  code, out, _ = _run(capsys, run, "--report", tmp_path / "rep")
  assert "What holds is" in out and "VIOLATED by the log" in out
  page = (tmp_path / "rep" / "report.html").read_text()
  assert "The log VIOLATES the declared schema" in page
  assert 'class="verdict warn"' in page


def test_duplicates_leave_those_clients_uncovered(tmp_path, capsys):
  run = make_run(tmp_path / "run", duplicate=True)
  got = json.loads(_run(capsys, run, "--json")[1])
  assert "except the 1 clients with duplicate" in got["statement"]
  assert "no claim holds for them" in got["statement"]


def test_no_dp_states_no_guarantee_and_no_epsilon(tmp_path, capsys):
  run = make_run(tmp_path / "run", sigma=0.0)
  code, out, _ = _run(capsys, run, "--report", tmp_path / "rep")
  assert code == 0
  assert "No privacy guarantee: the noise multiplier is 0" in out
  assert "-DP" not in out and "epsilon" not in out.split("privacy statement:")[1].split("\n")[1]
  got = json.loads((tmp_path / "rep" / "audit.json").read_text())
  # No finite epsilon: strict JSON writes null, never Infinity (issue 26, A.3).
  assert got["privacy_guarantee"] is False and got["epsilon"] is None
  assert not (tmp_path / "rep" / "epsilon_vs_rounds.png").exists()  # no ε to follow
  assert "No privacy guarantee" in (tmp_path / "rep" / "report.html").read_text()


def test_report_refusals_come_before_any_work(tmp_path, capsys, monkeypatch):
  run = make_run(tmp_path / "run")
  calls = []
  monkeypatch.setattr(log_statistics, "statistics_of_file", lambda *a, **k: calls.append(1))
  # An existing file.
  target = tmp_path / "report.txt"
  target.write_text("keep me")
  code, out, err = _run(capsys, run, "--report", target)
  assert code == 2 and "is a file" in err and target.read_text() == "keep me"
  # A directory that already holds a report (the run's own), without --force.
  (run / "report.html").write_text("the run's own report")
  code, out, err = _run(capsys, run, "--report", run)
  assert code == 2 and "already holds a report (report.html)" in err and "--force" in err
  assert (run / "report.html").read_text() == "the run's own report"
  # A directory that cannot be created.
  code, out, err = _run(capsys, run, "--report", target / "sub")
  assert code == 2 and len(err.strip().splitlines()) == 1
  assert calls == []  # the log was never read
  monkeypatch.undo()
  code, out, err = _run(capsys, run, "--report", run, "--force")
  assert code == 0 and (run / "report.html").read_text().startswith("<!DOCTYPE html>")
  assert out.count("report.html") == 1  # each artifact printed once


def test_report_includes_the_runs_training_curves(tmp_path, capsys):
  run = make_run(tmp_path / "run")
  assert _run(capsys, run, "--report", tmp_path / "rep", "--max-epsilon", "50")[0] == 0
  rep = tmp_path / "rep"
  for name in (
    "training.png",
    "checkins.png",
    "epsilon_vs_rounds.png",
    "participations_per_client.png",
  ):
    assert (rep / name).stat().st_size > 1000, name
  page = (rep / "report.html").read_text()
  assert page.count("data:image/png;base64,") == 5  # ε, participations, gaps, training, check-ins
  assert "Check-ins refused" in page and "Test accuracy and loss" in page
  assert sorted(os.listdir(rep)) == sorted(
    [
      "audit.json",
      "checkins.png",
      "epsilon_curve.csv",
      "epsilon_vs_rounds.png",
      "gap_histogram.png",
      "participations_per_client.png",
      "report.html",
      "report.md",
      "training.png",
    ]
  )
  with open(rep / "epsilon_curve.csv", newline="") as f:
    curve = list(csv.DictReader(f))
  assert [int(row["rounds"]) for row in curve] == list(range(1, ROUNDS + 1))
  audited = json.loads((rep / "audit.json").read_text())["epsilon"]
  assert float(curve[-1]["epsilon"]) == pytest.approx(audited, rel=1e-3)


# --- A run directory's own files are user input: refused in one line, never an "internal error" --

HUGE = "1" + "0" * 400  # A JSON integer beyond float64: `float()` of it raises OverflowError.


def _set_json_field(path: Path, dotted: str, raw: str) -> None:
  """Writes the JSON token `raw` (as is: NaN, 1e400, a 400-digit integer) into field `dotted`."""
  obj = json.loads(path.read_text())
  *parents, key = dotted.split(".")
  inner = obj
  for name in parents:
    inner = inner[name]
  inner[key] = "@@"
  path.write_text(json.dumps(obj).replace('"@@"', raw))


@pytest.mark.parametrize(
  "file, field",
  [
    ("plan.json", "noise_multiplier"),
    ("plan.json", "delta"),
    ("plan.json", "declared_schema.min_sep"),
    ("summary.json", "rounds_completed"),
  ],
)
def test_a_huge_integer_in_a_runs_json_is_refused_naming_the_field(tmp_path, capsys, file, field):
  run = make_run(tmp_path / "run")
  _set_json_field(run / file, field, HUGE)
  code, out, err = _run(capsys, run, "--json")
  line = one_line_error(code, out, err, file, repr(field.split(".")[-1]), "finite number")
  assert len(line) < 300  # the 400 digits shortened


@pytest.mark.parametrize("bad", ["abc", "nan", "-1", "1.5", "9" * 400])
def test_a_metrics_row_without_a_whole_round_is_refused_naming_the_row(tmp_path, capsys, bad):
  run = make_run(tmp_path / "run")
  lines = (run / "metrics.csv").read_text().splitlines()
  lines[3] = bad + lines[3][lines[3].index(",") :]  # The third row's round.
  (run / "metrics.csv").write_text("\n".join(lines) + "\n")
  code, out, err = _run(capsys, run, "--report", tmp_path / "rep")
  one_line_error(code, None, err, "metrics.csv: row 4: 'round' must be a whole number")


def test_infinite_metrics_are_gaps_in_the_training_plots(tmp_path, capsys):
  """A diverged round's loss may be inf (and a file may say 1e400): plotted as a gap, not a crash."""
  run = make_run(tmp_path / "run")
  lines = (run / "metrics.csv").read_text().splitlines()
  lines[3] = lines[3].split(",", 1)[0] + ",inf,1e400,-inf,1e400,0"
  (run / "metrics.csv").write_text("\n".join(lines) + "\n")
  _set_json_field(run / "summary.json", "initial_test_accuracy", HUGE)
  code, out, err = _run(capsys, run, "--report", tmp_path / "rep", "--max-epsilon", "50")
  assert code == 0, err
  assert (tmp_path / "rep" / "training.png").stat().st_size > 1000


RAW_TOKENS = ["NaN", "Infinity", "-1e400", HUGE, "-1", "0", '"abc"', "null", "[1]", "{}", "true"]
FIELDS = [
  ("plan.json", "noise_multiplier"),
  ("plan.json", "training_noise_multiplier"),
  ("plan.json", "epsilon"),
  ("plan.json", "delta"),
  ("plan.json", "declared_schema.n"),
  ("plan.json", "declared_schema.max_participations"),
  ("summary.json", "rounds_completed"),
  ("summary.json", "final_test_accuracy"),
  ("config.json", "rounds"),
]


@pytest.mark.parametrize("file, field", FIELDS)
def test_malformed_run_json_fields_are_audited_or_refused_in_one_line(
  tmp_path, capsys, file, field
):
  """Each field of the run's JSON files given each malformed token: the audit (and its report)
  either works or says what is wrong in one line (exit 2); never an internal error."""
  base = make_run(tmp_path / "base", summary=file == "summary.json" or field == "epsilon")
  plan = json.loads((base / "plan.json").read_text())
  plan["cheap_simulation"] = "sigma scaled to a cohort of 1000"  # reaches the notes' numbers too
  (base / "plan.json").write_text(json.dumps(plan))
  if file == "config.json":
    (base / "summary.json").unlink(missing_ok=True)  # the rounds then come from config.json
  for i, raw in enumerate(RAW_TOKENS):
    run = tmp_path / f"run{i}"
    shutil.copytree(base, run)
    _set_json_field(run / file, field, raw)
    # The report (plots) reads summary.json's accuracies; the rest is read by every audit.
    plots = file == "summary.json" and raw == HUGE  # a report takes 3 s
    report = ["--report", run / "rep", "--max-epsilon", "50"] if plots else []
    code, out, err = _run(capsys, run, "--json", *report)
    assert "internal error" not in err, (raw, err)
    if code != 0:
      one_line_error(code, out, err, file)
