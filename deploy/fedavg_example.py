#!/usr/bin/env python3
"""Drop fedmf's DP aggregator into a standard `tff.learning` FedAvg process.

This is the deployment pattern (mission 3): the aggregator is a plain
`tff.aggregators.UnweightedAggregationFactory`, so any TFF training program can use it,
unweighted directly or weighted through `tff.aggregators.as_weighted_aggregator`.

  python deploy/fedavg_example.py --strategy out/demo/blt.json --rounds 5 --noise-multiplier 1.0 --weighted
"""

from __future__ import annotations

import argparse
import sys


def build_process(
  strategy,
  *,
  noise_multiplier: float,
  clients_per_round: int,
  weighted: bool,
  dim: int,
  num_classes: int,
  num_rounds: int,
):
  import tensorflow as tf
  import tensorflow_federated as tff
  from fedmf.tff import build_dp_aggregator

  def model_fn():
    keras_model = tf.keras.Sequential(
      [tf.keras.layers.InputLayer(input_shape=(dim,)), tf.keras.layers.Dense(num_classes)]
    )
    return tff.learning.models.from_keras_model(
      keras_model,
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=(tf.TensorSpec([None, dim], tf.float32), tf.TensorSpec([None], tf.int32)),
    )

  aggregator = build_dp_aggregator(
    strategy,
    noise_multiplier=noise_multiplier,
    clip_norm=1.0,
    clients_per_round=clients_per_round,
    num_rounds=num_rounds,
  )
  optimizers = dict(
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0, 0.9),
  )
  if weighted:
    return tff.learning.algorithms.build_weighted_fed_avg(
      model_fn, model_aggregator=tff.aggregators.as_weighted_aggregator(aggregator), **optimizers
    )
  return tff.learning.algorithms.build_unweighted_fed_avg(
    model_fn, model_aggregator=aggregator, **optimizers
  )


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--strategy", required=True, help="strategy JSON file")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--clients-per-round", type=int, default=5)
  parser.add_argument("--noise-multiplier", type=float, default=1.0)
  parser.add_argument(
    "--weighted", action="store_true", help="weighted FedAvg via as_weighted_aggregator"
  )
  args = parser.parse_args(argv)

  from fedmf.simulation.synthetic import client_datasets, make_synthetic_data
  from fedmf.tff.context import local_execution_context

  data = make_synthetic_data(num_clients=args.clients_per_round * 4, seed=0)
  with local_execution_context():  # Shuts TFF's worker_binary down on exit.
    process = build_process(
      args.strategy,
      noise_multiplier=args.noise_multiplier,
      clients_per_round=args.clients_per_round,
      weighted=args.weighted,
      dim=data.dim,
      num_classes=data.num_classes,
      num_rounds=args.rounds,
    )
    state = process.initialize()
    for r in range(args.rounds):
      cohort = [
        (r * args.clients_per_round + i) % data.num_clients for i in range(args.clients_per_round)
      ]
      output = process.next(state, client_datasets(data, cohort))
      state = output.state
      aggregator = output.metrics["aggregator"]
      print(
        f"round {r}: train loss {float(output.metrics['client_work']['train']['loss']):.4f}, "
        f"noise std on the mean {float(aggregator['noise_stddev']):.4g}, "
        f"clipped {int(aggregator['clipped_count'])}"
      )
  return 0


if __name__ == "__main__":
  sys.exit(main())
