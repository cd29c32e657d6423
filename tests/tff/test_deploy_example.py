"""The deployment example builds weighted FedAvg with the DP aggregator and runs rounds."""

from tests.helpers import load_script


def test_weighted_fedavg_example_runs(tmp_path, capsys):
  example = load_script("deploy/fedavg_example.py")
  strategy = tmp_path / "blt.json"
  strategy.write_text('{"mechanism": "blt", "buf_decay": [0.9], "output_scale": [0.3]}')
  assert (
    example.main(
      ["--strategy", str(strategy), "--rounds", "2", "--clients-per-round", "3", "--weighted"]
    )
    == 0
  )
  lines = capsys.readouterr().out.strip().splitlines()
  assert [line.split(":")[0] for line in lines] == ["round 0", "round 1"]
  # Round 0's noise std on the mean is σ·ζ·‖row_0 C⁻¹‖/clients_per_round = 1/3.
  assert "noise std on the mean 0.3333" in lines[0]


def test_the_production_recipe_runs(tmp_path, capsys):
  example = load_script("deploy/fedavg_example.py")
  strategy = tmp_path / "blt.json"
  strategy.write_text('{"mechanism": "blt", "buf_decay": [0.9], "output_scale": [0.3]}')
  args = ["--strategy", str(strategy), "--rounds", "3", "--clients-per-round", "3", "--recipe"]
  assert example.main(args) == 0
  lines = capsys.readouterr().out.strip().splitlines()
  clips = [float(line.rsplit("clip norm ", 1)[1]) for line in lines]
  assert clips[0] == 0.1 and len(set(clips)) == 3  # adaptive: ζ moves every round
  # Round 0's noise std on the mean is σ·ζ_0·‖row_0 C⁻¹‖/clients_per_round = 0.1/3.
  assert "noise std on the mean 0.03333" in lines[0]
