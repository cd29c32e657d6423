"""What the TFF worker and the coordinator wait on when neither computes (issue 22, item 2).

Run it beside a benchmark: every `--interval` seconds it reads the CPU time of the `worker_binary`
process and of the coordinator (the Python process whose arguments contain `--coordinator`, e.g.
`round_profile.py`); when neither used CPU in the last interval, it prints, per process, how
many threads sit in which system call (/proc/PID/task/TID/syscall), with whether each futex wait
has a timeout and each epoll/poll wait its timeout in ms. With --stacks N, for the first N stalls
it also prints the worker's native stacks (gdb, attached for a moment), grouped: how many threads
wait in which function. That is how the stalls of issue 22 were found (docs/benchmarks.md §4):
threads in `RootDataset::Iterator::~Iterator` joining tf.data's autotuning thread, which slept in
`Model::OptimizeLoop`. Stdlib only (and gdb for --stacks), Linux only.

  .venv/bin/python benchmarks/round_profile.py --rounds 12 &
  python3 benchmarks/stall_sampler.py --coordinator round_profile.py --seconds 300 [--stacks 3]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import time

# x86-64 system call numbers of the waits worth naming.
_SYSCALLS = {
  0: "read", 1: "write", 7: "poll", 23: "select", 35: "nanosleep", 45: "recvfrom", 47: "recvmsg",
  61: "wait4", 202: "futex", 230: "clock_nanosleep", 232: "epoll_wait", 270: "pselect6",
  271: "ppoll", 275: "splice", 281: "epoll_pwait", 288: "accept4",
}  # fmt: skip


def cpu_ticks(pid: int):
  """utime + stime of `pid` in clock ticks, or None once it is gone."""
  try:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
  except OSError:
    return None
  return int(fields[11]) + int(fields[12])


def waits(pid: int) -> collections.Counter:
  """How many of `pid`'s threads are in which system call (timeouts shown)."""
  out = collections.Counter()
  for tid in os.listdir(f"/proc/{pid}/task"):
    try:
      call = open(f"/proc/{pid}/task/{tid}/syscall").read().split()
    except OSError:
      continue
    if call[0] == "running":
      out["running"] += 1
      continue
    number, args = int(call[0]), [int(a, 16) for a in call[1:7]]
    name = _SYSCALLS.get(number, f"syscall {number}")
    if number == 202:  # futex(uaddr, op, val, timeout, ...)
      name += f" op{args[1] & 0x7F} timeout={'yes' if args[3] else 'no'}"
    elif number in (232, 281):  # epoll_wait(fd, events, maxevents, timeout_ms)
      name += f" timeout_ms={args[3] if args[3] < 2**31 else -1}"
    elif number == 7:  # poll(fds, nfds, timeout_ms)
      name += f" timeout_ms={args[2] if args[2] < 2**31 else -1}"
    out[name] += 1
  return out


def find(coordinator: str) -> tuple[int, int]:
  """(worker pid, coordinator pid): the worker is the process whose argv[0] is worker_binary (the
  namespace bridge only names it among its arguments), the coordinator a Python process running
  `coordinator` (not a shell that started it)."""
  while True:
    worker = coord = None
    for entry in os.listdir("/proc"):
      if not entry.isdigit() or int(entry) == os.getpid():
        continue
      try:
        argv = open(f"/proc/{entry}/cmdline").read().split("\0")
      except OSError:
        continue
      if argv[0].endswith("worker_binary"):
        worker = int(entry)
      elif "python" in os.path.basename(argv[0]) and any(coordinator in a for a in argv[1:]):
        coord = int(entry)
    if worker and coord:
      return worker, coord
    time.sleep(0.5)


# Frames that say only "this thread waits" (locks, futexes, thread pools' idle loops, libc, std).
_PLUMBING = re.compile(
  r"^(syscall|__|nsync::|std::|absl::|Absl|Eigen::|tsl::|start_thread|clone|pthread|\?\?|epoll|"
  r"poll|gpr_|grpc_core::|void absl)"
)


def stacks(pid: int, depth: int = 14) -> collections.Counter:
  """How many of `pid`'s threads wait in which function (gdb attaches for a few seconds)."""
  gdb = ["gdb", "-p", str(pid), "-batch", "-ex", f"thread apply all bt {depth}"]
  return group_stacks(subprocess.run(gdb, capture_output=True, text=True, timeout=120).stdout)


def group_stacks(gdb_output: str) -> collections.Counter:
  """gdb's `thread apply all bt` output → how many threads wait in which function: each thread's
  first frame that is not plumbing (the binary's dynamic symbols name TF's and TFF's functions)."""
  found = collections.Counter()
  for thread in gdb_output.split("\nThread ")[1:]:
    frames = re.findall(r"#\d+\s+(?:0x[0-9a-f]+ in )?(.+?) \(", thread)
    names = [re.sub(r"<.*>", "<>", f) for f in frames]
    if not names:
      continue
    found[next((n for n in names if not _PLUMBING.match(n)), "(idle: " + names[0] + ")")[:110]] += 1
  return found


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--coordinator", default="round_profile.py")
  parser.add_argument("--interval", type=float, default=0.5)
  parser.add_argument("--seconds", type=float, default=300.0)
  parser.add_argument("--stacks", type=int, default=0, help="native stacks of the first N stalls")
  args = parser.parse_args()
  worker, coord = find(args.coordinator)
  print(f"worker {worker}, coordinator {coord}", flush=True)
  start, last = time.monotonic(), (cpu_ticks(worker), cpu_ticks(coord))
  while time.monotonic() - start < args.seconds:
    time.sleep(args.interval)
    now = (cpu_ticks(worker), cpu_ticks(coord))
    if None in now:
      break
    if now == last:
      print(
        f"{time.monotonic() - start:7.1f} s both asleep; worker: {dict(waits(worker))}; "
        f"coordinator: {dict(waits(coord))}",
        flush=True,
      )
      if args.stacks > 0:
        args.stacks -= 1
        for function, count in stacks(worker).most_common():
          print(f"    {count:3d} worker threads in {function}", flush=True)
        now = (cpu_ticks(worker), cpu_ticks(coord))  # gdb's own stop is not the worker's work
    last = now


if __name__ == "__main__":
  main()
