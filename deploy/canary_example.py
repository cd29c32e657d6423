#!/usr/bin/env python3
"""Measure the privacy of your own `tff.learning` FedAvg loop with canary clients.

`fedmf.tff.canary_factory` wraps fedmf's DP aggregator (any mechanism): each round it adds the
round's inserted canaries to the noised mean and measures the projections of the released mean on
every canary direction (`metrics['aggregator']['canaries']['projections']`). After the loop,
`factory.estimate(...)` turns the collected projections into both threat models' ε estimates and
one-run lower bounds beside the analytic ε of the canaries' pattern (docs/empirical-privacy.md).

  python deploy/canary_example.py --strategy blt.json --rounds 10 --min-sep 4 \\
    --noise-multiplier 1.2 --canaries 300 --held-out 300 [--weighted] [--json]
"""

from __future__ import annotations

import argparse
import sys


def build_process(
  strategy,
  model_fn,
  *,
  noise_multiplier: float,
  clip_norm: float,
  clients_per_round: int,
  num_rounds: int,
  min_sep: int,
  canaries: int,
  held_out: int,
  seed: int,
  weighted: bool,
  noise_seed=None,
):
  """FedAvg whose model-update mean is fedmf's DP aggregator wrapped with canaries: returns the
  learning process and the canary factory (which keeps the canaries' design and directions)."""
  import tensorflow_federated as tff
  from fedmf.tff import build_dp_aggregator, canary_factory

  aggregator = build_dp_aggregator(
    strategy,
    noise_multiplier=noise_multiplier,
    clip_norm=clip_norm,
    clients_per_round=clients_per_round,
    num_rounds=num_rounds,
    noise_seed=noise_seed,
  )
  factory = canary_factory(
    aggregator,
    count=canaries,
    held_out=held_out,
    seed=seed,
    num_rounds=num_rounds,
    pattern="worst-case",  # the rounds that attain the strategy's sensitivity under min_sep
    strategy=strategy,
    min_sep=min_sep,
  )
  optimizers = dict(
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.5),
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0, 0.9),
  )
  if weighted:
    process = tff.learning.algorithms.build_weighted_fed_avg(
      model_fn, model_aggregator=tff.aggregators.as_weighted_aggregator(factory), **optimizers
    )
  else:
    process = tff.learning.algorithms.build_unweighted_fed_avg(
      model_fn, model_aggregator=factory, **optimizers
    )
  return process, factory


def run(task, strategy, *, rounds: int, clients_per_round: int, delta: float = 1e-6, **options):
  """Runs `rounds` rounds of FedAvg on `task` (in the installed TFF context) and returns the
  canaries' `fedmf.privacy.empirical.EmpiricalPrivacy`; `options`: `build_process`'s keywords."""
  import numpy as np

  process, factory = build_process(
    strategy,
    task.model_fn(),
    clients_per_round=clients_per_round,
    num_rounds=rounds,
    **options,
  )
  state = process.initialize()
  initial = [np.asarray(w) for w in process.get_model_weights(state).trainable]
  projections = []
  for r in range(rounds):
    cohort = [(r * clients_per_round + i) % task.num_clients for i in range(clients_per_round)]
    output = process.next(state, [task.client_dataset(i) for i in cohort])
    state = output.state
    projections.append(output.metrics["aggregator"]["canaries"]["projections"])  # (M,) per round
  final = [np.asarray(w) for w in process.get_model_weights(state).trainable]
  return factory.estimate(
    projections,
    strategy=strategy,
    noise_multiplier=options["noise_multiplier"],
    delta=delta,
    initial_weights=initial,  # for the final_model threat model
    final_weights=final,
  )


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--strategy", required=True, help="strategy JSON file")
  parser.add_argument("--rounds", type=int, default=10)
  parser.add_argument("--min-sep", type=int, default=4, help="b: rounds between participations")
  parser.add_argument("--clients-per-round", type=int, default=3)
  parser.add_argument("--noise-multiplier", type=float, default=1.2)
  parser.add_argument("--clip-norm", type=float, default=0.5)
  parser.add_argument("--canaries", type=int, default=300, help="inserted, on average")
  parser.add_argument("--held-out", type=int, default=300, help="held out, on average")
  parser.add_argument("--seed", type=int, default=1, help="the canaries' seed")
  parser.add_argument("--delta", type=float, default=1e-6)
  parser.add_argument(
    "--weighted", action="store_true", help="weighted FedAvg via as_weighted_aggregator"
  )
  parser.add_argument("--json", action="store_true", help="print the estimates as JSON")
  args = parser.parse_args(argv)

  from fedmf.jsonio import json_text
  from fedmf.tasks.synthetic import SyntheticTask
  from fedmf.tff.context import local_execution_context

  # Any tff.learning model and client data work; here fedmf's built-in synthetic next-word data.
  task = SyntheticTask(
    num_clients=60,
    vocab_size=40,
    preset="lstm-small",
    sequence_length=20,
    batch_size=16,
    max_sentences=8,
    test_sentences=32,
    seed=0,
  )
  with local_execution_context():  # Shuts TFF's worker_binary down on exit.
    result = run(
      task,
      args.strategy,
      rounds=args.rounds,
      clients_per_round=args.clients_per_round,
      delta=args.delta,
      noise_multiplier=args.noise_multiplier,
      clip_norm=args.clip_norm,
      min_sep=args.min_sep,
      canaries=args.canaries,
      held_out=args.held_out,
      seed=args.seed,
      weighted=args.weighted,
    )
  print(json_text(result.to_dict()) if args.json else "\n".join(result.summary_lines()))
  return 0


if __name__ == "__main__":
  sys.exit(main())
