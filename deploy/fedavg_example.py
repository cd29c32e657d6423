#!/usr/bin/env python3
"""Drop fedmf's DP aggregator into a standard `tff.learning` FedAvg process.

This is the deployment pattern (mission 3): the aggregator is a plain
`tff.aggregators.UnweightedAggregationFactory`, so any TFF training program can use it,
unweighted directly or weighted through `tff.aggregators.as_weighted_aggregator`.

  python deploy/fedavg_example.py --strategy out/demo/strategy.json --rounds 5 --noise-multiplier 1.0 --weighted

With --recipe, the production recipe (Gboard's DP-FTRL, docs/aggregators.md): adaptive clipping to
the median update norm (Andrew et al. 2021) and TFF's SecureSumFactory under the DP aggregator.
"""

from __future__ import annotations

import argparse
import sys


def build_process(
  strategy,
  model_fn,
  *,
  noise_multiplier: float,
  clients_per_round: int,
  weighted: bool,
  num_rounds: int,
  recipe: bool = False,
):
  """tff.learning FedAvg whose model-update mean is fedmf's DP aggregator; with `recipe`, an
  adaptive clip and secure summation of the clipped records."""
  import tensorflow_federated as tff
  from fedmf.privacy.adaptive_clip import AdaptiveClip
  from fedmf.tff import build_dp_aggregator

  extra = {}
  if recipe:
    extra["record_aggregation_factory"] = tff.aggregators.SecureSumFactory(
      upper_bound_threshold=1.0, lower_bound_threshold=-1.0
    )
  aggregator = build_dp_aggregator(
    strategy,
    noise_multiplier=noise_multiplier,
    # ζ: fixed, or adaptive (its count noise: Andrew et al.'s clients_per_round / 10).
    clip_norm=AdaptiveClip(target_quantile=0.5, initial=0.1) if recipe else 1.0,
    clients_per_round=clients_per_round,
    num_rounds=num_rounds,
    **extra,
  )
  optimizers = dict(
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.5),
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
  parser.add_argument(
    "--recipe",
    action="store_true",
    help="adaptive clipping and TFF's SecureSumFactory (docs/aggregators.md)",
  )
  args = parser.parse_args(argv)

  from fedmf.tasks.synthetic import SyntheticTask
  from fedmf.tff.context import local_execution_context

  # Any tff.learning model and client data work; here fedmf's built-in synthetic next-word data.
  task = SyntheticTask(
    num_clients=args.clients_per_round * 4,
    vocab_size=50,
    preset="lstm-small",
    sequence_length=20,
    batch_size=8,
    max_sentences=16,
    test_sentences=32,
    seed=0,
  )
  with local_execution_context():  # Shuts TFF's worker_binary down on exit.
    process = build_process(
      args.strategy,
      task.model_fn(),
      noise_multiplier=args.noise_multiplier,
      clients_per_round=args.clients_per_round,
      weighted=args.weighted,
      num_rounds=args.rounds,
      recipe=args.recipe,
    )
    state = process.initialize()
    for r in range(args.rounds):
      cohort = [
        (r * args.clients_per_round + i) % task.num_clients for i in range(args.clients_per_round)
      ]
      output = process.next(state, [task.client_dataset(i) for i in cohort])
      state = output.state
      aggregator = output.metrics["aggregator"]
      aggregator = aggregator.get("dp", aggregator)  # (under a record aggregation factory)
      clip = (
        f", clip norm {float(aggregator['clip_norm']):.4g}" if "clip_norm" in aggregator else ""
      )
      print(
        f"round {r}: train loss {float(output.metrics['client_work']['train']['loss']):.4f}, "
        f"noise std on the mean {float(aggregator['noise_stddev']):.4g}, "
        f"clipped {int(aggregator['clipped_count'])}{clip}"
      )
  return 0


if __name__ == "__main__":
  sys.exit(main())
