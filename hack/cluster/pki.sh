#!/usr/bin/env bash
# Creates the certificates and keys of the local cluster with the openssl CLI.
#
#   hack/cluster/pki.sh PKI_DIR NODE_NAME [SERVICE_IP]
#
# Existing files are kept (re-running is a no-op), so a cluster that is
# restarted keeps its identity.  Layout of PKI_DIR:
#   ca.{crt,key}                      cluster CA (signs everything below)
#   apiserver.{crt,key}               kube-apiserver serving cert
#   apiserver-kubelet-client.{crt,key}  apiserver -> kubelet client (system:masters)
#   admin.{crt,key}                   kubectl/helm (O=system:masters)
#   kubelet-client.{crt,key}          system:node:<node>, O=system:nodes
#   kubelet-serving.{crt,key}         kubelet :10250 serving cert
#   controller-manager.{crt,key}      system:kube-controller-manager
#   scheduler.{crt,key}               system:kube-scheduler
#   sa.{key,pub}                      service-account token signing key pair
set -euo pipefail

PKI="${1:?usage: pki.sh PKI_DIR NODE_NAME [SERVICE_IP]}"
NODE="${2:?node name}"
SERVICE_IP="${3:-10.0.0.1}"
DAYS=3650

mkdir -p "${PKI}"
chmod 700 "${PKI}"
cd "${PKI}"

if [[ ! -f ca.crt ]]; then
  openssl genrsa -out ca.key 2048 2>/dev/null
  openssl req -x509 -new -nodes -key ca.key -sha256 -days "${DAYS}" \
    -subj "/CN=gpu-share-local-ca" -out ca.crt \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"
fi

# issue NAME SUBJECT USAGE [SAN]
#   USAGE is clientAuth, serverAuth or both ("serverAuth,clientAuth").
issue() {
  local name="$1" subj="$2" usage="$3" san="${4:-}"
  [[ -f "${name}.crt" ]] && return 0
  openssl genrsa -out "${name}.key" 2048 2>/dev/null
  openssl req -new -key "${name}.key" -subj "${subj}" -out "${name}.csr"
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=${usage}"
    [[ -n "${san}" ]] && echo "subjectAltName=${san}"
  } >"${name}.ext"
  openssl x509 -req -in "${name}.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
    -days "${DAYS}" -sha256 -extfile "${name}.ext" -out "${name}.crt" 2>/dev/null
  rm -f "${name}.csr" "${name}.ext"
}

issue apiserver "/CN=kube-apiserver" serverAuth \
  "DNS:localhost,DNS:${NODE},DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:${SERVICE_IP}"
issue apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
issue admin "/O=system:masters/CN=kubernetes-admin" clientAuth
issue kubelet-client "/O=system:nodes/CN=system:node:${NODE}" clientAuth
issue kubelet-serving "/CN=${NODE}" serverAuth "DNS:localhost,DNS:${NODE},IP:127.0.0.1"
issue controller-manager "/CN=system:kube-controller-manager" clientAuth
issue scheduler "/CN=system:kube-scheduler" clientAuth

if [[ ! -f sa.key ]]; then
  openssl genrsa -out sa.key 2048 2>/dev/null
  openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
fi
chmod 600 ./*.key
