"""The READMEs' command blocks, copied top to bottom as a new user does (issue 38 items 7, 20)."""

import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# In the order a user meets them: the README, then the deploy README it points to.
READMES = ("README.md", "deploy/README.md")


def _commands():
  """(file, command words) of every line of every ```bash block, continuation lines joined."""
  for name in READMES:
    text = (REPO / name).read_text()
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
      for line in block.replace("\\\n", " ").splitlines():
        line = line.split(" #")[0].strip()
        if line and not line.startswith("#"):
          yield name, shlex.split(line)


def test_no_block_writes_a_file_an_earlier_block_already_wrote():
  """`--out FILE` without --force is refused when FILE exists: the deploy README's example wrote
  blt.json again after the README's block had (refused on a first day)."""
  written = {}
  for name, words in _commands():
    if "--out" in words and "--force" not in words and words[:1] == ["fedmf"]:
      out = words[words.index("--out") + 1]
      if out.endswith(".json"):
        assert out not in written, f"{name}: --out {out} was already written in {written[out]}"
        written[out] = name
  assert "blt.json" in written  # The check saw the blocks.


def _train_example():
  """The README's `fedmf train` command: (config file, --set overrides)."""
  for name, words in _commands():
    if name == "README.md" and words[:2] == ["fedmf", "train"]:
      sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
      return REPO / words[words.index("--config") + 1], sets
  raise AssertionError("the README has no fedmf train example")


def test_the_readme_train_example_plans_within_its_budget(tmp_path, monkeypatch):
  """Issue 38 item 7: the example planned epsilon 8.28 against its config's budget of 8 and
  stopped after 13 of its 20 rounds, saying so only at the end. Its plan (TF-free: participation
  model, strategy, accountant) must fit the budget, so every round it asks for is trained; the
  budget guard accounts the realized participation, which the declared schema bounds."""
  from fedmf import participation
  from fedmf.program import plan as plan_lib
  from fedmf.program.config import load_config

  monkeypatch.setenv("FEDMF_CACHE_DIR", str(tmp_path))
  path, sets = _train_example()
  config = load_config(path, sets)
  budget = config.program.budget.epsilon
  assert budget is not None
  model = participation.build(
    config.participation,
    config.task.num_clients,
    config.program.clients_per_round,
    config.program.seed,
    config.poisson_groups,
  )
  schema = model.declared_schema(config.program.rounds)
  strategy = plan_lib.resolve_strategy(config, schema, plan_lib.cache_dir())
  plan = plan_lib.make_plan(config, model, strategy, schema)
  assert plan.epsilon <= budget, (sets, plan.epsilon)
  assert plan_lib.rounds_within_budget(plan, budget) == config.program.rounds
  # The example as it was: the warning's round is where that run stopped (13 of 20).
  old = plan_lib.make_plan(load_config(path, ["rounds=20"]), model, strategy, schema)
  assert old.epsilon > budget
  assert plan_lib.rounds_within_budget(old, budget) == 13


def test_the_readme_picture_is_the_demos_report():
  """Issue 38 item 10: docs/img/report.png came from another run. tools/readme_screenshot.py
  makes it from `python3 dev.py demo`'s report and records the default config it ran."""
  import hashlib
  import json

  record = json.loads((REPO / "docs" / "img" / "report.json").read_text())
  config = REPO / "simulations" / "configs" / "default.yaml"
  assert record["made_by"] == "python3 tools/readme_screenshot.py"
  assert record["config_sha256"] == hashlib.sha256(config.read_bytes()).hexdigest(), (
    "the default config changed since docs/img/report.png was made: run `python3 dev.py demo` "
    "and `python3 tools/readme_screenshot.py`"
  )
  assert (REPO / "docs" / "img" / "report.png").stat().st_size > 10_000
  assert "tools/readme_screenshot.py" in (REPO / "README.md").read_text()
