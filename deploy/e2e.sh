#!/usr/bin/env bash
# End to end, for real: build the image with podman, run deploy/compose.yaml (a coordinator and two
# workers over mutual TLS, as uid 10001 with no capability and read-only root file systems), train
# 6 rounds, and compare the released model bit for bit with `fedmf train` run in-process on this
# host. Tears everything down (containers, network, volume) on exit, also on failure.
#
#   deploy/e2e.sh            # exit 0: the image built, the stack trained, the models are equal
#
# Needs root (rootful podman) and Debian's podman, podman-compose, runc and mmdebstrap (installed
# with apt-get when missing). No image registry is needed: the base image is made from Debian's
# packages with mmdebstrap. Took 24 minutes on this 2-core machine under a load average of 35
# (build 12 min, 6 rounds in the containers 5 min, the in-process run 7 min); the image's Python
# packages (about 1.5 GB) are downloaded by the build. Environment:
#   E2E_WORK    working directory (default /var/tmp/fedmf-e2e); the base image is kept between runs
#   E2E_KEEP=1  keep the stack running after the comparison (for a look around)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${E2E_WORK:-/var/tmp/fedmf-e2e}
project=fedmf-e2e
image=localhost/fedmf:e2e
base=localhost/fedmf-debian-base:bookworm
fedmf=${FEDMF:-$repo/.venv/bin/fedmf}
say() { printf 'e2e: %s\n' "$*" >&2; }
fail() { say "FAILED: $*"; exit 1; }

[[ $(id -u) == 0 ]] || fail "run as root (rootful podman)"
missing=()
for tool in podman podman-compose runc mmdebstrap; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
  say "installing ${missing[*]} from Debian's packages"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    podman podman-compose runc mmdebstrap uidmap >/dev/null
fi
[[ -x $fedmf ]] || fedmf=$(command -v fedmf) || fail "no fedmf for the in-process run"
mkdir -p "$work"
# crun (podman's default runtime) fails on these machines ("setrlimit RLIMIT_NOFILE: Operation not
# permitted", then "cgroups in hybrid mode not supported"); runc with lowered limits works.
cat > "$work/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
EOF
export CONTAINERS_CONF=$work/containers.conf

compose=(podman-compose -p "$project" -f "$work/deploy/compose-e2e.yaml")
teardown() {
  local code=$?
  if [[ ${E2E_KEEP:-0} != 1 && -f $work/deploy/compose-e2e.yaml ]]; then
    "${compose[@]}" down -v >/dev/null 2>&1 || true
    podman network rm -f "${project}_fedmf" >/dev/null 2>&1 || true  # podman-compose 1.0 keeps it
    rm -rf "$work/deploy"  # the throwaway CA and keys with it
  fi
  exit $code
}
trap teardown EXIT

start=$SECONDS
if ! podman image exists "$base"; then
  say "making the base image from Debian's packages (mmdebstrap)"
  mmdebstrap --variant=minbase --include=python3,python3-venv,ca-certificates,iproute2 \
    bookworm "$work/rootfs.tar" "deb http://deb.debian.org/debian bookworm main" \
    "deb http://deb.debian.org/debian bookworm-updates main" \
    "deb http://deb.debian.org/debian-security bookworm-security main" 2>"$work/mmdebstrap.log" \
    || fail "mmdebstrap (see $work/mmdebstrap.log)"
  podman import "$work/rootfs.tar" "$base" >/dev/null
  rm -f "$work/rootfs.tar"
fi

say "building $image"
secret=()
# Behind a TLS-intercepting proxy the build needs the CA bundle this host trusts: a build secret,
# never stored in a layer (checked below).
[[ -s /etc/ssl/certs/ca-certificates.crt ]] &&
  secret=(--secret id=build_ca,src=/etc/ssl/certs/ca-certificates.crt)
podman build -f "$repo/deploy/Dockerfile" --build-arg BASE="$base" "${secret[@]}" -t "$image" \
  "$repo" >"$work/build.log" 2>&1 || fail "podman build (see $work/build.log)"
for local_ca in /usr/local/share/ca-certificates/*.crt; do
  [[ -f $local_ca ]] || continue
  line=$(sed -n 2p "$local_ca")
  if podman run --rm --entrypoint grep "$image" -qF -- "$line" /etc/ssl/certs/ca-certificates.crt
  then fail "the build's CA $local_ca is in the shipped image"; fi
done
say "image built in $((SECONDS - start)) s; no build CA inside"

# The shipped compose file next to certificates made for it, with one change: the coordinator's
# config is a 6-round one (podman-compose 1.0 concatenates the lists of an override file, so the
# change is made in a copy).
rm -rf "$work/deploy" "$work/reference"
mkdir -p "$work/deploy"
cp "$repo/deploy/compose.yaml" "$work/deploy/"
bash "$repo/deploy/certs/make-certs.sh" "$work/deploy/certs/out" worker-0 worker-1 >/dev/null
chmod 755 "$work/deploy/certs/out"
chown 10001 "$work/deploy/certs/out/worker.key" "$work/deploy/certs/out/coordinator.key"
tiny='task: synthetic
num_clients: 60
vocab_size: 40
clients_per_round: 4
clients_per_call: 1
max_sentences_per_client: 16
test_sentences: 64
eval_every: 3
participation: {min_sep: 3}
noise_seed: 3
noise_multiplier: 1.0
rounds: 6
checkpoint_every: 2
seed: 0'
printf '%s\nworkers: ["worker-0:8470", "worker-1:8470"]\nworker_tls: {ca: /certs/ca.pem, cert: /certs/coordinator.pem, key: /certs/coordinator.key}\nworker_timeout_s: 600\n' \
  "$tiny" >"$work/deploy/e2e-train.yaml"
printf '%s\nworkers: 0\n' "$tiny" >"$work/deploy/in-process.yaml"
chmod 644 "$work/deploy/e2e-train.yaml"
"$(dirname "$fedmf")/python" - "$work/deploy" <<'EOF'
import sys, yaml
directory = sys.argv[1]
doc = yaml.safe_load(open(f"{directory}/compose.yaml"))
coordinator = doc["services"]["coordinator"]
coordinator["command"][coordinator["command"].index("--config") + 1] = "/e2e/e2e-train.yaml"
coordinator["volumes"].append("./e2e-train.yaml:/e2e/e2e-train.yaml:ro")
coordinator["restart"] = "no"
yaml.safe_dump(doc, open(f"{directory}/compose-e2e.yaml", "w"), sort_keys=False)
EOF

say "starting the stack: 2 workers and the coordinator"
FEDMF_IMAGE=$image "${compose[@]}" up -d >"$work/compose-up.log" 2>&1 ||
  fail "podman-compose up (see $work/compose-up.log)"
coordinator=${project}_coordinator_1
code=$(timeout 1200 podman wait "$coordinator") || fail "the coordinator did not finish in 20 min"
podman logs "$coordinator" >"$work/coordinator.log" 2>&1 || true
for w in worker-0 worker-1; do
  podman logs "${project}_${w}_1" >"$work/$w.log" 2>&1 || true
  podman exec "${project}_${w}_1" grep -q "^CapEff:.0000000000000000" /proc/1/status ||
    fail "$w runs with capabilities"
  [[ $(podman exec "${project}_${w}_1" id -u) == 10001 ]] || fail "$w does not run as 10001"
  grep -q "isolated in its own network namespace" "$work/$w.log" ||
    fail "$w did not isolate its worker_binary (see $work/$w.log)"
  ! grep -q "refused client" "$work/$w.log" || fail "$w refused the coordinator"
done
[[ $code == 0 ]] || fail "the coordinator exited with $code (see $work/coordinator.log)"
podman cp "$coordinator:/data/run/release/final_model.npz" "$work/containers_model.npz"
say "the stack trained 6 rounds in $((SECONDS - start)) s since the start"

say "the same run in-process on this host (workers: 0)"
FEDMF_CACHE_DIR=$work/cache "$fedmf" train --config "$work/deploy/in-process.yaml" \
  --root "$work/reference" --no-progress >"$work/reference.log" 2>&1 ||
  fail "in-process fedmf train (see $work/reference.log)"
"$(dirname "$fedmf")/python" - "$work/containers_model.npz" "$work/reference/release/final_model.npz" <<'EOF' ||
import sys
import numpy as np
a, b = (np.load(p) for p in sys.argv[1:3])
assert a.files == b.files, (a.files, b.files)
for k in a.files:
  x, y = a[k], b[k]
  assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), k
print(f"e2e: the models are equal bit for bit ({len(a.files)} arrays, "
      f"{sum(a[k].size for k in a.files)} weights)", file=sys.stderr)
EOF
  fail "the containers' model differs from the in-process one"
say "PASSED in $((SECONDS - start)) s"
