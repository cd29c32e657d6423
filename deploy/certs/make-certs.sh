#!/usr/bin/env bash
# A CA and certificates for fedmf's mutual TLS (tests, demos, the compose file and Kubernetes).
#
#   deploy/certs/make-certs.sh OUT_DIR [WORKER_NAME_OR_IP ...]
#
# Writes into OUT_DIR:
#   ca.pem, ca.key               the CA both sides trust (worker_tls.ca / --tls-client-ca) and its
#                                key (0600), kept for rotations: keep it off the workers and the
#                                coordinator (deploy/README.md, "Rotating certificates")
#   worker.pem, worker.key       the workers' certificate (serverAuth), valid for every name/IP given
#                                (default: localhost 127.0.0.1 worker-0 worker-1)
#   coordinator.pem, coordinator.key   the coordinator's client certificate (clientAuth), named
#                                fedmf-coordinator (CN and SAN): the name `fedmf worker` allows by
#                                default
# When OUT_DIR already holds ca.pem and ca.key, that CA signs the new certificates (a rotation:
# the peers keep trusting the same CA); otherwise a new CA is made. Keys are created 0600.
# Validity: CA_DAYS (default 365) for a new CA, DAYS (default 30) for the certificates.
# For production, an organisation's CA may sign instead (deploy/README.md: allow-list the
# coordinator's name, since that CA signs many certificates).
set -euo pipefail
out=${1:?usage: make-certs.sh OUT_DIR [WORKER_NAME_OR_IP ...]}
shift
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(localhost 127.0.0.1 worker-0 worker-1)
days=${DAYS:-30}
ca_days=${CA_DAYS:-365}
coordinator=${COORDINATOR_NAME:-fedmf-coordinator}
umask 077
mkdir -p "$out"
san=""
for n in "${names[@]}"; do
  if [[ $n =~ ^[0-9.]+$ || $n == *:* ]]; then san+="IP:$n,"; else san+="DNS:$n,"; fi
done
san=${san%,}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [[ -f $out/ca.pem && -f $out/ca.key ]]; then
  kept="kept the CA in $out (ca.pem, ca.key)"
else
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days "$ca_days" \
    -subj "/CN=fedmf CA" -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -keyout "$tmp/ca.key" -out "$tmp/ca.pem" 2>/dev/null
  mv "$tmp/ca.key" "$out/ca.key"
  mv "$tmp/ca.pem" "$out/ca.pem"
  kept="made a new CA valid $ca_days days"
fi
sign() {  # name, subject, extensions
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "$2" \
    -keyout "$tmp/$1.key" -out "$tmp/$1.csr" 2>/dev/null
  printf '%s\n' "$3" > "$tmp/$1.ext"
  openssl x509 -req -in "$tmp/$1.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" \
    -CAserial "$tmp/ca.srl" -CAcreateserial -days "$days" -extfile "$tmp/$1.ext" \
    -out "$tmp/$1.pem" 2>/dev/null
  chmod 600 "$tmp/$1.key"
  chmod 644 "$tmp/$1.pem"
  # Each file replaced by a rename: a worker re-reading them sees the old or the new one, whole.
  mv "$tmp/$1.key" "$out/$1.key"
  mv "$tmp/$1.pem" "$out/$1.pem"
}
sign worker "/CN=fedmf worker" "subjectAltName=$san
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth"
sign coordinator "/CN=$coordinator" "subjectAltName=DNS:$coordinator
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"
chmod 600 "$out/ca.key"
chmod 644 "$out/ca.pem"
echo "wrote $out/{worker,coordinator}.{pem,key} for: ${names[*]} (valid $days days; $kept)"
