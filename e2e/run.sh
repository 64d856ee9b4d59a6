#!/usr/bin/env bash
# End-to-end suite on a kind cluster: build and load the images, install Prometheus,
# prometheus-adapter (pinned chart versions) and the hetero-infer chart, then for each autoscaling
# mode, "hpa" (examples/hpa.yaml) and "operator" (the operator scrapes the workers itself): deploy a
# mock-executor InferenceDeployment, send OpenAI requests through its Service, push load until it
# scales up, wait until the added pods are Ready, stop the load, wait until the queue drains and it
# scales back down; deleting it removes its children (no finalizer); tear everything down.
#
# Needs: docker (running), kind, kubectl, helm, network access for base images and charts.
# `pytest e2e` skips with the reason when one of them is missing (as on the development machines).
# Usage: e2e/run.sh            (from anywhere; `pytest e2e` runs it too)
# Environment:
#   CLUSTER_NAME   kind cluster name                       (default hetero-infer-e2e)
#   KEEP_CLUSTER   1: leave the cluster running at the end  (default 0)
#   SKIP_BUILD     1: reuse images already built            (default 0)
#   HELM, KUBECTL, KIND, DOCKER   binaries to use           (default: from PATH)
#   PROMETHEUS_CHART_VERSION, ADAPTER_CHART_VERSION
#                  prometheus-community chart versions      (default: the tested pins below)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CLUSTER_NAME="${CLUSTER_NAME:-hetero-infer-e2e}"
KEEP_CLUSTER="${KEEP_CLUSTER:-0}"
SKIP_BUILD="${SKIP_BUILD:-0}"
HELM="${HELM:-helm}"
KUBECTL="${KUBECTL:-kubectl}"
KIND="${KIND:-kind}"
DOCKER="${DOCKER:-docker}"

SYSTEM_NS="hetero-infer-system"
APP_NS="e2e"
WORKER_IMAGE="hetero-infer/worker:e2e-cpu"
OPERATOR_IMAGE_REPO="hetero-infer/operator"
OPERATOR_IMAGE_TAG="e2e"
CURL_IMAGE="curlimages/curl:8.11.1"
PROMETHEUS_CHART_VERSION="${PROMETHEUS_CHART_VERSION:-27.19.0}"
ADAPTER_CHART_VERSION="${ADAPTER_CHART_VERSION:-4.14.1}"
INFD="mock-autoscaled"
INFD_OPERATOR="mock-operator-scaled"
ADAPTER_RULES="hetero-infer-adapter-rules"
KUBE_CONTEXT="kind-${CLUSTER_NAME}"

log() { printf '\n==> %s\n' "$*"; }
fail() { printf '\nFAIL: %s\n' "$*" >&2; exit 1; }
k() { "${KUBECTL}" --context "${KUBE_CONTEXT}" "$@"; }
h() { "${HELM}" --kube-context "${KUBE_CONTEXT}" "$@"; }

# wait_until DESCRIPTION TIMEOUT_SECONDS COMMAND...: poll COMMAND every 5 s until it succeeds.
wait_until() {
  local what="$1" timeout="$2"
  shift 2
  local deadline=$((SECONDS + timeout))
  until "$@"; do
    if ((SECONDS >= deadline)); then
      fail "timed out after ${timeout}s waiting for ${what}"
    fi
    sleep 5
  done
  log "ok: ${what}"
}

cleanup() {
  local rc=$?
  if ((rc != 0)); then
    log "diagnostics (exit code ${rc})"
    k get infd,deploy,hpa,pods -A -o wide || true
    k describe infd -n "${APP_NS}" "${INFD}" || true
    k logs -n "${SYSTEM_NS}" -l app.kubernetes.io/component=operator --tail=200 || true
  fi
  if [[ "${KEEP_CLUSTER}" != "1" ]]; then
    log "deleting kind cluster ${CLUSTER_NAME}"
    "${KIND}" delete cluster --name "${CLUSTER_NAME}" || true
  fi
  exit "${rc}"
}

for tool in "${DOCKER}" "${KIND}" "${KUBECTL}" "${HELM}"; do
  command -v "${tool}" > /dev/null || fail "${tool} not found"
done
"${DOCKER}" info > /dev/null 2>&1 || fail "the Docker daemon is not reachable"

log "creating kind cluster ${CLUSTER_NAME}"
if ! "${KIND}" get clusters | grep -qx "${CLUSTER_NAME}"; then
  "${KIND}" create cluster --name "${CLUSTER_NAME}" --wait 180s
fi
trap cleanup EXIT

if [[ "${SKIP_BUILD}" != "1" ]]; then
  log "building images"
  "${DOCKER}" build -f "${ROOT}/docker/worker-cpu.Dockerfile" -t "${WORKER_IMAGE}" "${ROOT}"
  "${DOCKER}" build -f "${ROOT}/docker/operator.Dockerfile" -t "${OPERATOR_IMAGE_REPO}:${OPERATOR_IMAGE_TAG}" "${ROOT}"
fi
log "loading images into kind"
"${KIND}" load docker-image --name "${CLUSTER_NAME}" "${WORKER_IMAGE}" "${OPERATOR_IMAGE_REPO}:${OPERATOR_IMAGE_TAG}"

log "installing Prometheus and prometheus-adapter (custom metrics API for the HPA)"
h repo add prometheus-community https://prometheus-community.github.io/helm-charts --force-update > /dev/null
h upgrade --install prometheus prometheus-community/prometheus --version "${PROMETHEUS_CHART_VERSION}" \
  --namespace "${SYSTEM_NS}" --create-namespace \
  --set alertmanager.enabled=false --set prometheus-pushgateway.enabled=false \
  --set prometheus-node-exporter.enabled=false --set kube-state-metrics.enabled=false \
  --set server.persistentVolume.enabled=false --set server.global.scrape_interval=5s \
  --set server.global.evaluation_interval=5s --wait --timeout 10m

log "installing the hetero-infer chart"
h upgrade --install hetero-infer "${ROOT}/charts/hetero-infer" --namespace "${SYSTEM_NS}" \
  --set image.repository="${OPERATOR_IMAGE_REPO}" --set image.tag="${OPERATOR_IMAGE_TAG}" \
  --set image.pullPolicy=Never --set workerImage.cpu="${WORKER_IMAGE}" --set workerImage.pullPolicy=Never \
  --set prometheusAdapter.enabled=true --set prometheusAdapter.configMapName="${ADAPTER_RULES}" \
  --set resyncSeconds=15 --wait --timeout 5m
h upgrade --install prometheus-adapter prometheus-community/prometheus-adapter --version "${ADAPTER_CHART_VERSION}" \
  --namespace "${SYSTEM_NS}" \
  --set prometheus.url="http://prometheus-server.${SYSTEM_NS}.svc" --set prometheus.port=80 \
  --set rules.default=false --set rules.existing="${ADAPTER_RULES}" --wait --timeout 5m

log "deploying examples/hpa.yaml (mock executor, autoscaling mode hpa)"
k create namespace "${APP_NS}" --dry-run=client -o yaml | k apply -f -
k apply -n "${APP_NS}" -f "${ROOT}/examples/hpa.yaml"
k wait -n "${APP_NS}" "infd/${INFD}" --for=condition=Ready --timeout=10m
k get -n "${APP_NS}" infd "${INFD}"
k get -n "${APP_NS}" deploy,svc,pdb,hpa -l "hetero-infer.io/inference-deployment=${INFD}"

log "sending OpenAI requests through the Service"
SERVICE_URL="http://${INFD}.${APP_NS}.svc/v1"
models="$(k run -n "${APP_NS}" e2e-models --rm -i --restart=Never --quiet --image="${CURL_IMAGE}" -- \
  curl -sSf --retry 10 --retry-all-errors "${SERVICE_URL}/models")"
grep -q '"mock-smollm2"' <<< "${models}" || fail "/v1/models does not list mock-smollm2: ${models}"
reply="$(k run -n "${APP_NS}" e2e-chat --rm -i --restart=Never --quiet --image="${CURL_IMAGE}" -- \
  curl -sSf "${SERVICE_URL}/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model": "mock-smollm2", "max_tokens": 8, "messages": [{"role": "user", "content": "Hello"}]}')"
grep -q '"choices"' <<< "${reply}" || fail "chat completion without choices: ${reply}"
stream="$(k run -n "${APP_NS}" e2e-stream --rm -i --restart=Never --quiet --image="${CURL_IMAGE}" -- \
  curl -sSfN "${SERVICE_URL}/completions" -H 'Content-Type: application/json' \
  -d '{"model": "mock-smollm2", "prompt": "Once", "max_tokens": 8, "stream": true}')"
grep -q 'data: \[DONE\]' <<< "${stream}" || fail "streaming completion did not end with [DONE]"

# start_load NAME: a Job of 8 clients streaming long completions at NAME's Service for up to 10 minutes.
start_load() {
  local name="$1"
  cat <<YAML | k apply -n "${APP_NS}" -f -
apiVersion: batch/v1
kind: Job
metadata:
  name: e2e-load-${name}
spec:
  parallelism: 8
  completions: 8
  backoffLimit: 0
  activeDeadlineSeconds: 900
  template:
    spec:
      restartPolicy: Never
      securityContext:
        runAsNonRoot: true
        runAsUser: 100
      containers:
        - name: load
          image: ${CURL_IMAGE}
          command: ["/bin/sh", "-c"]
          args:
            - |
              end=\$((\$(date +%s) + 600))
              while [ "\$(date +%s)" -lt "\$end" ]; do
                curl -s -o /dev/null "http://${name}.${APP_NS}.svc/v1/completions" -H 'Content-Type: application/json' \
                  -d '{"model": "mock-smollm2", "prompt": "load", "max_tokens": 256, "ignore_eos": true}' &
                sleep 0.2
              done
              wait
YAML
}

stop_load() {
  k delete -n "${APP_NS}" job "e2e-load-$1" --wait=true
}

spec_replicas() {
  k get -n "${APP_NS}" "infd/$1" -o jsonpath='{.spec.replicas}'
}

scaled_up() {
  local replicas
  replicas="$(spec_replicas "$1")"
  k get -n "${APP_NS}" "infd/$1" --no-headers || true
  [[ "${replicas}" =~ ^[0-9]+$ ]] && ((replicas > 1))
}

scaled_down() {
  k get -n "${APP_NS}" "infd/$1" --no-headers || true
  [[ "$(spec_replicas "$1")" == "1" ]]
}

# all_ready NAME: the Deployment runs as many Ready pods as the InferenceDeployment asks for (the added
# pods loaded their model and pass /readyz), and the InferenceDeployment reports them.
all_ready() {
  local want ready reported
  want="$(spec_replicas "$1")"
  ready="$(k get -n "${APP_NS}" "deploy/$1" -o jsonpath='{.status.readyReplicas}')"
  reported="$(k get -n "${APP_NS}" "infd/$1" -o jsonpath='{.status.readyReplicas}')"
  [[ -n "${want}" && "${ready}" == "${want}" && "${reported}" == "${want}" ]]
}

# queue_drained NAME: no worker has a waiting request (mode operator: the operator's last observation;
# mode hpa: what prometheus-adapter serves the HPA).
queue_drained() {
  local mode values
  mode="$(k get -n "${APP_NS}" "infd/$1" -o jsonpath='{.spec.autoscaling.mode}')"
  if [[ "${mode}" == "operator" ]]; then
    values="$(k get -n "${APP_NS}" "infd/$1" -o jsonpath='{.status.metrics.queueDepth}')"
  else
    values="$(k get --raw "/apis/custom.metrics.k8s.io/v1beta1/namespaces/${APP_NS}/pods/*/hetero_infer_num_requests_waiting?labelSelector=hetero-infer.io/inference-deployment%3D$1" \
      | grep -o '"value":"[^"]*"' | cut -d'"' -f4 | sort -u | tr '\n' ' ')"
  fi
  echo "waiting requests: ${values:-none}"
  [[ -n "${values}" ]] && [[ "$(echo "${values}" | tr -d ' ')" =~ ^0+$ ]]
}

# autoscale_round NAME: load -> scale-up -> added pods Ready -> no load -> queue drained -> scale-down.
autoscale_round() {
  local name="$1"
  log "pushing load until ${name} scales up"
  start_load "${name}"
  wait_until "${name} to scale above 1 replica" 600 scaled_up "${name}"
  wait_until "the added pods of ${name} to become Ready" 600 all_ready "${name}"
  k get -n "${APP_NS}" deploy,pods -l "hetero-infer.io/inference-deployment=${name}"
  log "stopping the load; the queue drains, then ${name} scales down"
  stop_load "${name}"
  wait_until "the queue of ${name} to drain" 300 queue_drained "${name}"
  wait_until "${name} to scale back to 1 replica" 900 scaled_down "${name}"
  wait_until "${name} to run 1 Ready pod" 300 all_ready "${name}"
}

# delete_and_check NAME: no finalizer holds it, and the garbage collector takes its children.
delete_and_check() {
  local name="$1" finalizers
  finalizers="$(k get -n "${APP_NS}" "infd/${name}" -o jsonpath='{.metadata.finalizers}')"
  [[ -z "${finalizers}" ]] || fail "${name} carries finalizers: ${finalizers}"
  k delete -n "${APP_NS}" "infd/${name}" --wait=true --timeout=5m
  gone() {
    [[ -z "$(k get -n "${APP_NS}" deploy,svc,pdb,hpa -l "hetero-infer.io/inference-deployment=${name}" -o name)" ]]
  }
  wait_until "the children of ${name} to be deleted" 300 gone
}

log "autoscaling mode hpa (${INFD}): the HPA scales on the worker metrics from prometheus-adapter"
autoscale_round "${INFD}"
k get -n "${APP_NS}" hpa "${INFD}"

log "autoscaling mode operator (${INFD_OPERATOR}): the operator scrapes the workers and sets spec.replicas"
cat <<YAML | k apply -n "${APP_NS}" -f -
apiVersion: hetero-infer.io/v1alpha1
kind: InferenceDeployment
metadata:
  name: ${INFD_OPERATOR}
spec:
  model:
    name: mock-smollm2
  executor: mock
  replicas: 1
  engine:
    maxNumSeqs: 4
  autoscaling:
    enabled: true
    mode: operator
    minReplicas: 1
    maxReplicas: 3
    targetQueueDepth: 2
    intervalSeconds: 5
    scaleDownStabilizationSeconds: 30
YAML
k wait -n "${APP_NS}" "infd/${INFD_OPERATOR}" --for=condition=Ready --timeout=10m
autoscale_round "${INFD_OPERATOR}"
k get -n "${APP_NS}" "infd/${INFD_OPERATOR}" -o jsonpath='{.status.conditions[?(@.type=="ScalingActive")]}'
echo

log "deleting the InferenceDeployments removes their children"
delete_and_check "${INFD}"
delete_and_check "${INFD_OPERATOR}"

log "e2e passed"
