"""`fedmf simulate`: DP FedAvg on synthetic data under a client timer, ending in an audit."""

import json

from fedmf.privacy import participation_log
from fedmf.cli import main as cli
from fedmf.mf import strategies as st


def test_simulation_end_to_end(tmp_path, capsys):
  strategy = tmp_path / "blt.json"
  st.save_strategy(
    st.load_strategy({"mechanism": "blt", "buf_decay": [0.9, 0.4], "output_scale": [0.2, 0.2]}),
    strategy,
  )
  out = tmp_path / "run"
  code = cli.main(
    [
      "simulate",
      "--strategy",
      str(strategy),
      "--rounds",
      "6",
      "--min-sep",
      "2",
      "--clients",
      "12",
      "--clients-per-round",
      "3",
      "--noise-multiplier",
      "0.5",
      "--delta",
      "1e-5",
      "--eval-every",
      "3",
      "--out",
      str(out),
      "--no-progress",
      "--json",
    ]
  )
  assert code == 0
  summary = json.loads(capsys.readouterr().out)
  rounds = participation_log.read_participation_arrays(out / "participation.csv").rounds
  assert len(rounds) == 18 and sorted(set(rounds.tolist())) == list(range(6))
  # The client timer enforced the declared separation, and the audit found exactly that.
  assert summary["audit"]["observed_min_sep"] >= 2
  assert summary["violations"] == 0
  assert summary["declared_max_participations"] == 3
  assert 0 < summary["audit"]["epsilon"] < float("inf")
  metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  assert [m["round"] for m in metrics] == list(range(6))
  assert all(m["aggregator/noise_stddev"] > 0 for m in metrics)
  assert "test_accuracy" in metrics[2] and "test_accuracy" in metrics[5]
  assert (out / "audit" / "report.md").exists()
  assert not list(out.glob(".*partial*")) and not list(out.glob(".*tmp*"))


def test_simulation_rejects_a_population_too_small_for_the_timer(tmp_path, capsys):
  strategy = tmp_path / "dpsgd.json"
  strategy.write_text('{"mechanism": "dpsgd"}')
  code = cli.main(
    [
      "simulate",
      "--strategy",
      str(strategy),
      "--rounds",
      "4",
      "--min-sep",
      "3",
      "--clients",
      "5",
      "--clients-per-round",
      "3",
      "--noise-multiplier",
      "1",
      "--out",
      str(tmp_path / "x"),
    ]
  )
  assert code == 2
  assert "num_clients" in capsys.readouterr().err
