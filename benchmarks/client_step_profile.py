#!/usr/bin/env python3
"""One client step of an LSTM preset in plain TF: where the time goes, against pure matmuls.

Times, in one process and interleaved, on one batch of StackOverflow-shaped data (batch 16 × 20
tokens, random ids, 10,000 words):

  matmul     the step's matmuls alone (the same shapes and FLOPs as forward + backward)
  forward    the model's forward pass and loss
  step       forward + backward + SGD update (what TFF's client loop runs per batch)
  step-xla   the same step under `tf.function(jit_compile=True)`

and prints ms per batch (wall and process CPU time), GFLOP/s and each ratio against `matmul`, for
--threads intra-op threads. CPU time is what to compare on a shared machine: other processes stretch
the wall time but hardly this process's CPU time.

  .venv/bin/python benchmarks/client_step_profile.py [--model lstm-paper] [--threads 2] [--seconds 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _cpu() -> float:
  t = os.times()
  return t.user + t.system


def _median(values):
  return sorted(values)[len(values) // 2]


# The client step both client-step benchmarks time (this one and benchmarks/client_step_ops.py).
LENGTH = 20  # tokens per sentence


def seeded_batch(vocab: int, batch: int = 16, length: int = LENGTH):
  """One batch of StackOverflow-shaped data: (x, y) int32 [batch, length], random ids (seed 0)."""
  import numpy as np

  rng = np.random.default_rng(0)
  x = rng.integers(1, vocab, size=(batch, length)).astype(np.int32)
  y = rng.integers(1, vocab, size=(batch, length)).astype(np.int32)
  return x, y


def seeded_model(preset: str, vocab: int, length: int = LENGTH):
  """(Keras model of `preset`, its loss), seeded, built in the current context (eager or a graph)."""
  import tensorflow as tf

  from fedmf.tasks import models

  tf.random.set_seed(0)
  return models.build_keras_model(preset, vocab, length), models.loss_fn()


def sgd_step(model, loss_fn, x, y, dense: bool = False, learning_rate: float = 0.1):
  """Forward, backward and SGD update of `model` on one batch: (loss, the update ops).

  The embedding's gradient (IndexedSlices) is applied by a sparse scatter, or with `dense` as one
  dense tensor (as the graph of a TFF client's SGD applies it)."""
  import tensorflow as tf

  with tf.GradientTape() as tape:
    loss = loss_fn(y, model(x, training=True))
  weights = model.trainable_weights
  updates = []
  for w, g in zip(weights, tape.gradient(loss, weights)):
    if isinstance(g, tf.IndexedSlices) and not dense:
      updates.append(w.scatter_sub(tf.IndexedSlices(learning_rate * g.values, g.indices)))
    else:
      updates.append(w.assign_sub(learning_rate * tf.convert_to_tensor(g)))
  return loss, updates


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--model", default="lstm-paper")
  parser.add_argument("--vocab", type=int, default=10_000)
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0: TF's default)")
  parser.add_argument("--seconds", type=float, default=3.0)
  parser.add_argument("--arms", default="matmul,forward,step,step-xla")
  args = parser.parse_args(argv)

  import tensorflow as tf

  if args.threads:
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
  from fedmf.tasks import model_sizes

  spec = model_sizes.PRESETS[args.model]
  e, h, v, b, t = (
    spec.embedding_size,
    spec.lstm_size,
    model_sizes.num_classes(args.vocab),
    args.batch,
    LENGTH,
  )
  x, y = (tf.constant(a) for a in seeded_batch(args.vocab, b))
  model, loss_fn = seeded_model(args.model, args.vocab)

  def step():
    return sgd_step(model, loss_fn, x, y)[0]

  n = b * t
  # forward: x@K [n,e]x[e,4h], per step h@U [b,h]x[h,4h], proj [n,h]x[h,e], out [n,e]x[e,v];
  # backward: dX and dW of each (the recurrent dh = dz@U^T per step, dU once over n rows).
  shapes = [
    ((n, e), (e, 4 * h)),
    *[((b, h), (h, 4 * h))] * t,
    ((n, h), (h, e)),
    ((n, e), (e, v)),
    ((n, 4 * h), (4 * h, e)),  # dx
    ((e, n), (n, 4 * h)),  # dK
    *[((b, 4 * h), (4 * h, h))] * t,  # dh
    ((h, n), (n, 4 * h)),  # dU
    ((n, e), (e, h)),  # d proj input
    ((h, n), (n, e)),  # d proj W
    ((n, v), (v, e)),  # d out input
    ((e, n), (n, v)),  # d out W
  ]
  mats = [(tf.random.normal(a), tf.random.normal(bb)) for a, bb in shapes]
  flops = sum(2 * a[0] * a[1] * bb[1] for a, bb in shapes)

  @tf.function
  def matmuls():
    return tf.add_n([tf.reduce_sum(tf.matmul(p, q)[:1, :1]) for p, q in mats])

  arms = {
    "matmul": matmuls,
    "forward": tf.function(lambda: loss_fn(y, model(x, training=True))),
    "step": tf.function(step),
    "step-xla": tf.function(step, jit_compile=True),
  }
  arms = {k: fn for k, fn in arms.items() if k in args.arms.split(",")}
  for fn in arms.values():
    fn()
    fn()
  times = {k: [] for k in arms}
  cpu = {k: [] for k in arms}
  deadline = time.perf_counter() + args.seconds * len(arms)
  while time.perf_counter() < deadline:
    for k, fn in arms.items():
      c0, start = _cpu(), time.perf_counter()
      for _ in range(5):
        out = fn()
      float(out)
      times[k].append((time.perf_counter() - start) / 5)
      cpu[k].append((_cpu() - c0) / 5)
  base = min(times["matmul"]) if "matmul" in times else None
  base_cpu = _median(cpu["matmul"]) if "matmul" in cpu else None
  print(
    f"{args.model}, batch {b}×{t}, intra-op threads {args.threads or 'default'}; step matmul "
    f"FLOPs {flops / 1e9:.2f} GFLOP; load {os.getloadavg()[0]:.2f}"
  )
  for k, ts in times.items():
    best = min(ts)
    c = _median(cpu[k])
    ratio = f"  {best / base:.2f}× matmul (wall), {c / base_cpu:.2f}× (CPU)" if base else ""
    print(
      f"  {k:9s} wall best {best * 1e3:7.1f} ms  median {_median(ts) * 1e3:7.1f} ms  "
      f"({flops / best / 1e9:6.1f} GFLOP/s)  CPU median {c * 1e3:7.1f} ms "
      f"({flops / c / 1e9:6.1f} GFLOP per CPU-s){ratio}"
    )
  return 0


if __name__ == "__main__":
  sys.exit(main())
