#!/usr/bin/env bash
# A throwaway CA and certificates for fedmf's mutual TLS (tests, demos, the compose file).
#
#   deploy/certs/make-certs.sh OUT_DIR [WORKER_NAME_OR_IP ...]
#
# Writes into OUT_DIR:
#   ca.pem                       the CA both sides trust (worker_tls.ca / --tls-client-ca)
#   worker.pem, worker.key       the workers' certificate, valid for every name/IP given
#                                (default: localhost 127.0.0.1 worker-0 worker-1)
#   coordinator.pem, coordinator.key   the coordinator's client certificate (worker_tls.cert/key)
# Keys are created 0600; the CA key is deleted at the end, so nothing more can be signed.
# For production, use your organisation's CA instead (deploy/README.md).
set -euo pipefail
out=${1:?usage: make-certs.sh OUT_DIR [WORKER_NAME_OR_IP ...]}
shift
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(localhost 127.0.0.1 worker-0 worker-1)
mkdir -p "$out"
umask 077
san=""
for n in "${names[@]}"; do
  if [[ $n =~ ^[0-9.]+$ || $n == *:* ]]; then san+="IP:$n,"; else san+="DNS:$n,"; fi
done
san=${san%,}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
  -subj "/CN=fedmf throwaway CA" -keyout "$tmp/ca.key" -out "$out/ca.pem" 2>/dev/null
sign() {  # name, subject, extensions
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "$2" \
    -keyout "$out/$1.key" -out "$tmp/$1.csr" 2>/dev/null
  printf '%s\n' "$3" > "$tmp/$1.ext"
  openssl x509 -req -in "$tmp/$1.csr" -CA "$out/ca.pem" -CAkey "$tmp/ca.key" -CAcreateserial \
    -days 30 -extfile "$tmp/$1.ext" -out "$out/$1.pem" 2>/dev/null
}
sign worker "/CN=fedmf worker" "subjectAltName=$san
extendedKeyUsage=serverAuth"
sign coordinator "/CN=fedmf coordinator" "extendedKeyUsage=clientAuth"
chmod 600 "$out"/*.key
chmod 644 "$out"/*.pem
rm -f "$out/ca.srl"
echo "wrote $out/{ca.pem,worker.pem,worker.key,coordinator.pem,coordinator.key} for: ${names[*]}"
