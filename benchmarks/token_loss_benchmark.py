#!/usr/bin/env python3
"""The output layer of `lstm-paper` with TF's fused cross-entropy kernel and with fedmf's token loss.

Times, in one process and interleaved, on one batch of 16 × 20 tokens (320 rows, 96 → 10,004
classes, the shape of `lstm-paper`'s output layer):

  matmuls        the layer's three matmuls alone (forward, dW, dx): the baseline
  softmax        the forward matmul + `tf.nn.softmax`
  fused-forward  the forward matmul + TF's `SparseSoftmaxCrossEntropyWithLogits` (the loss metric's
                 work in TFF's client loop)
  fused          forward + backward with TF's kernel (`tf.keras` `SparseCategoricalCrossentropy`)
  token-loss     forward + backward with `fedmf.tasks.token_loss.sparse_cross_entropy`

and prints the median ms per call (wall and process CPU time) and each against `matmuls`.

  .venv/bin/python benchmarks/token_loss_benchmark.py [--threads 1] [--seconds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _cpu() -> float:
  t = os.times()
  return t.user + t.system


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--threads", type=int, default=1, help="intra-op threads (0: TF's default)")
  parser.add_argument("--seconds", type=float, default=2.0, help="per arm")
  parser.add_argument("--classes", type=int, default=10_004)
  args = parser.parse_args(argv)

  import numpy as np
  import tensorflow as tf

  if args.threads:
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
  from fedmf.tasks.token_loss import sparse_cross_entropy

  rng = np.random.default_rng(0)
  rows, width = 320, 96
  h = tf.constant(rng.normal(size=(rows, width)).astype(np.float32))
  kernel = tf.Variable(rng.normal(size=(width, args.classes)).astype(np.float32) * 0.1)
  bias = tf.Variable(np.zeros(args.classes, np.float32))
  labels = tf.constant(rng.integers(0, args.classes, rows).astype(np.int32))

  def forward_backward(loss_fn):
    @tf.function
    def run():
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(loss_fn(labels, tf.matmul(h, kernel) + bias))
      return tape.gradient(loss, [kernel, bias])

    return run

  @tf.function
  def matmuls():
    logits = tf.matmul(h, kernel)
    return tf.matmul(h, logits, transpose_a=True), tf.matmul(logits, kernel, transpose_b=True)

  arms = {
    "matmuls": matmuls,
    "softmax": tf.function(lambda: tf.nn.softmax(tf.matmul(h, kernel) + bias)),
    "fused-forward": tf.function(
      lambda: tf.raw_ops.SparseSoftmaxCrossEntropyWithLogits(
        features=tf.matmul(h, kernel) + bias, labels=labels
      )
    ),
    "fused": forward_backward(
      lambda y, z: tf.keras.losses.sparse_categorical_crossentropy(y, z, from_logits=True)
    ),
    "token-loss": forward_backward(sparse_cross_entropy),
  }
  for fn in arms.values():
    fn()
  wall = {k: [] for k in arms}
  cpu = {k: [] for k in arms}
  deadline = time.perf_counter() + args.seconds * len(arms)
  while time.perf_counter() < deadline:
    for k, fn in arms.items():
      c0, t0 = _cpu(), time.perf_counter()
      for _ in range(5):
        out = fn()
      tf.nest.map_structure(lambda t: t.numpy(), out)
      wall[k].append((time.perf_counter() - t0) / 5)
      cpu[k].append((_cpu() - c0) / 5)
  base_wall, base_cpu = statistics.median(wall["matmuls"]), statistics.median(cpu["matmuls"])

  def times(value: float, base: float) -> str:
    # os.times() ticks every 10 ms: a tiny run (the smoke test) can measure 0 CPU seconds.
    return f"x{value / base:.2f}" if base > 0 else "x-"

  print(
    f"output layer [{rows}, {width}] x [{width}, {args.classes}], intra-op threads "
    f"{args.threads or 'default'}; load {os.getloadavg()[0]:.2f}"
  )
  for k in arms:
    w, c = statistics.median(wall[k]), statistics.median(cpu[k])
    print(
      f"  {k:14s} wall {w * 1e3:6.1f} ms ({times(w, base_wall)} matmuls)  CPU {c * 1e3:6.1f} ms "
      f"({times(c, base_cpu)})"
    )
  return 0


if __name__ == "__main__":
  sys.exit(main())
