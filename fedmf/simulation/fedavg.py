"""End-to-end DP FedAvg simulation on the synthetic dataset, ending in a privacy audit.

One concept: the driver that ties the layers together (design.md's flow). A client timer picks
each round's cohort under b-min-separation, TFF FedAvg trains with fedmf's correlated-noise DP
aggregator, every participation goes to the participation log, and the auditor turns that log
into the privacy claim the run supports. Noise multipliers are either given or calibrated for a
target ε under the declared (b, k) before training.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

from fedmf.errors import FedmfUserError

logger = logging.getLogger("fedmf.simulate")


@dataclasses.dataclass(frozen=True)
class SimulationConfig:
  strategy: Any  # object, dict or path; read by fedmf.mf.strategies.load_strategy
  rounds: int
  min_sep: int
  max_participations: Optional[int] = None
  clients_per_round: int = 10
  num_clients: int = 200
  availability: float = 1.0
  noise_multiplier: Optional[float] = None
  target_epsilon: Optional[float] = None
  delta: float = 1e-6
  clip_norm: float = 1.0
  client_learning_rate: float = 0.1
  server_learning_rate: float = 1.0
  server_momentum: float = 0.9
  examples_per_client: int = 32
  batch_size: int = 8
  eval_every: int = 10
  seed: int = 0
  noise_seed: Optional[int] = None  # None: drawn from OS randomness (recommended)

  def validate(self) -> None:
    if self.rounds < 1 or self.min_sep < 1 or self.clients_per_round < 1:
      raise FedmfUserError("rounds, min_sep and clients_per_round must be positive")
    if self.num_clients < self.clients_per_round * self.min_sep:
      raise FedmfUserError(
        f"num_clients ({self.num_clients}) must be at least clients_per_round × min_sep "
        f"({self.clients_per_round * self.min_sep}) so every round can fill its cohort"
      )
    if (self.noise_multiplier is None) == (self.target_epsilon is None):
      raise FedmfUserError("give exactly one of noise_multiplier and target_epsilon")

  @property
  def declared_max_participations(self) -> int:
    from fedmf.mf.sensitivity import effective_max_participations

    return effective_max_participations(self.rounds, self.min_sep, self.max_participations)


def _flatten(prefix: str, value: Any, out: dict[str, float]) -> None:
  if isinstance(value, dict) or hasattr(value, "items"):
    for key, item in value.items():
      _flatten(f"{prefix}/{key}" if prefix else str(key), item, out)
  else:
    array = np.asarray(value)
    if array.size == 1 and np.issubdtype(array.dtype, np.number):
      out[prefix] = float(array.reshape(()))


def _atomic_write(path: Path, text: str) -> None:
  tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
  tmp.write_text(text)
  os.replace(tmp, path)


def run_simulation(
  config: SimulationConfig,
  out_dir: str | os.PathLike,
  *,
  progress: bool = True,
  report: bool = True,
) -> dict[str, Any]:
  """Runs the simulation; writes participation.csv, metrics.jsonl, summary.json and audit/ in out_dir."""
  from fedmf.privacy import accounting, audit, participation_log
  from fedmf.mf import strategies
  from fedmf.mf.schema import ParticipationSchema
  from fedmf.simulation.client_timer import ClientTimer
  from fedmf.simulation.synthetic import client_datasets, make_synthetic_data

  config.validate()
  strategy = strategies.load_strategy(config.strategy)
  strategy.check_horizon(config.rounds)
  strategy.check_streamable()
  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  k_declared = config.declared_max_participations

  if config.target_epsilon is not None:
    calibrated = accounting.calibrate_noise_multiplier(
      strategy,
      ParticipationSchema(config.rounds, config.min_sep, k_declared),
      config.target_epsilon,
      config.delta,
    )
    sigma = calibrated.noise_multiplier
    logger.info(
      "calibrated noise multiplier %.6g for ε=%g at δ=%g under b=%d, k=%d (sensitivity %.6g, %s)",
      sigma,
      config.target_epsilon,
      config.delta,
      config.min_sep,
      k_declared,
      calibrated.sensitivity,
      calibrated.sensitivity_method,
    )
  else:
    sigma = float(config.noise_multiplier)

  import tensorflow as tf
  import tensorflow_federated as tff
  from fedmf.tff.context import local_execution_context
  from fedmf.tff.learning import build_dp_fed_avg

  data = make_synthetic_data(config.num_clients, config.examples_per_client, seed=config.seed)
  timer = ClientTimer(
    config.num_clients,
    config.min_sep,
    config.clients_per_round,
    config.max_participations,
    config.availability,
    seed=config.seed,
  )

  def keras_model():
    tf.keras.utils.set_random_seed(config.seed)
    return tf.keras.Sequential(
      [tf.keras.layers.InputLayer(input_shape=(data.dim,)), tf.keras.layers.Dense(data.num_classes)]
    )

  def model_fn():
    return tff.learning.models.from_keras_model(
      keras_model(),
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=(tf.TensorSpec([None, data.dim], tf.float32), tf.TensorSpec([None], tf.int32)),
      metrics=[tf.keras.metrics.SparseCategoricalAccuracy()],
    )

  def test_accuracy(process, state) -> float:
    # The model is one dense layer; evaluating it in numpy avoids mixing Keras graphs with TFF's.
    kernel, bias = (np.asarray(w) for w in process.get_model_weights(state).trainable)
    logits = data.test_features @ kernel + bias
    return float(np.mean(np.argmax(logits, axis=1) == data.test_labels))

  log_path = out / "participation.csv"
  metrics_rows: list[dict[str, Any]] = []
  bar = None
  if progress:
    from tqdm import tqdm

    bar = tqdm(total=config.rounds, desc="simulate", unit="round", dynamic_ncols=True)
  start = time.perf_counter()
  with local_execution_context():
    process = build_dp_fed_avg(
      model_fn,
      strategy,
      noise_multiplier=sigma,
      clip_norm=config.clip_norm,
      clients_per_round=config.clients_per_round,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(config.client_learning_rate),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(
        config.server_learning_rate, config.server_momentum
      ),
      noise_seed=config.noise_seed,
      num_rounds=config.rounds,
    )
    state = process.initialize()
    initial_accuracy = test_accuracy(process, state)
    with participation_log.ParticipationLogWriter(log_path) as log:
      for r in range(config.rounds):
        cohort = timer.sample(r)
        if cohort.size == 0:
          raise FedmfUserError(
            f"round {r}: no client is eligible; lower min_sep or availability, or add clients"
          )
        output = process.next(state, client_datasets(data, cohort, config.batch_size))
        state = output.state
        log.write_round(r, [data.client_id(i) for i in cohort])
        row: dict[str, Any] = {"round": r, "clients": int(cohort.size)}
        _flatten("", output.metrics, row)
        if (r + 1) % config.eval_every == 0 or r + 1 == config.rounds:
          row["test_accuracy"] = test_accuracy(process, state)
        metrics_rows.append(row)
        if bar is not None:
          bar.update(1)
          if "test_accuracy" in row:
            bar.set_postfix(test_accuracy=f"{row['test_accuracy']:.3f}", refresh=False)
  if bar is not None:
    bar.close()
  seconds = time.perf_counter() - start
  _atomic_write(out / "metrics.jsonl", "".join(json.dumps(row) + "\n" for row in metrics_rows))

  result = audit.audit_log(
    log_path,
    strategy,
    sigma,
    config.delta,
    rounds=config.rounds,
    min_sep=config.min_sep,
    max_participations=k_declared,
  )
  audit_dict = result.to_dict()
  _atomic_write(out / "audit.json", json.dumps(audit_dict, indent=1) + "\n")
  if report:
    from fedmf.privacy import report as report_lib

    report_lib.write_report(result, out / "audit")

  summary = {
    "strategy": strategy.describe(),
    "rounds": config.rounds,
    "clients_per_round": config.clients_per_round,
    "num_clients": config.num_clients,
    "declared_min_sep": config.min_sep,
    "declared_max_participations": k_declared,
    "noise_multiplier": sigma,
    "initial_test_accuracy": initial_accuracy,
    "final_test_accuracy": metrics_rows[-1].get("test_accuracy"),
    "seconds": seconds,
    "audit": {
      key: audit_dict.get(key)
      for key in (
        "observed_min_sep",
        "observed_max_participations",
        "sensitivity",
        "sensitivity_method",
        "rho",
        "epsilon",
        "delta",
      )
    },
    "violations": len(audit_dict.get("violations", [])),
    "outputs": {
      "log": str(log_path),
      "metrics": str(out / "metrics.jsonl"),
      "audit": str(out / "audit.json"),
      "report": str(out / "audit" / "report.md") if report else None,
    },
  }
  _atomic_write(out / "summary.json", json.dumps(summary, indent=1) + "\n")
  return summary
