#!/usr/bin/env bash
# Usage: scripts/make-test-ca.sh DIR [HOST_IP]
#
# Makes a throwaway CA and a server certificate for HOST_IP (default 127.0.0.1, also valid
# for "localhost") signed by it, for tests of `yarl-root --tls-cert/--tls-key` and of
# nginx's `yarl_roots https://…` with `yarl_sync_ca`. Writes into DIR:
#   ca.pem                 the CA certificate: give it to clients (yarl_sync_ca, curl --cacert)
#   server.pem, server.key the root's certificate chain and key (--tls-cert, --tls-key)
# EC P-256 keys, valid for 2 days; nothing is reused between runs. Needs the openssl CLI.
set -euo pipefail

if [ $# -lt 1 ]; then
    echo "usage: $0 DIR [HOST_IP]" >&2
    exit 2
fi
DIR=$1
IP=${2:-127.0.0.1}
mkdir -p "$DIR"
cd "$DIR"

openssl ecparam -name prime256v1 -genkey -noout -out ca.key 2>/dev/null
openssl req -x509 -new -key ca.key -sha256 -days 2 -subj "/CN=yarl test CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out ca.pem 2>/dev/null

openssl ecparam -name prime256v1 -genkey -noout -out server.ec.key 2>/dev/null
# rustls and nginx both read PKCS#8.
openssl pkcs8 -topk8 -nocrypt -in server.ec.key -out server.key
rm -f server.ec.key
openssl req -new -key server.key -subj "/CN=$IP" -out server.csr 2>/dev/null
cat >server.ext <<EXT
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=IP:$IP,DNS:localhost
EXT
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -sha256 \
    -extfile server.ext -out server.pem 2>/dev/null
rm -f server.csr server.ext ca.srl
chmod 600 ca.key server.key
echo "make-test-ca: $DIR/ca.pem, $DIR/server.pem, $DIR/server.key for $IP" >&2
