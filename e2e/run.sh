#!/usr/bin/env bash
# End-to-end suite on a kind cluster: build and load the images, install Prometheus,
# prometheus-adapter and the hetero-infer chart, deploy the mock-executor InferenceDeployment in
# autoscaling mode "hpa", send OpenAI requests through its Service, push load until it scales up,
# stop and watch it scale down, tear everything down.
#
# Needs: docker (running), kind, kubectl, helm, network access for base images and charts.
# Usage: e2e/run.sh            (from anywhere; `pytest e2e` runs it too)
# Environment:
#   CLUSTER_NAME   kind cluster name                       (default hetero-infer-e2e)
#   KEEP_CLUSTER   1: leave the cluster running at the end  (default 0)
#   SKIP_BUILD     1: reuse images already built            (default 0)
#   HELM, KUBECTL, KIND, DOCKER   binaries to use           (default: from PATH)
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
INFD="mock-autoscaled"
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
h upgrade --install prometheus prometheus-community/prometheus --namespace "${SYSTEM_NS}" --create-namespace \
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
h upgrade --install prometheus-adapter prometheus-community/prometheus-adapter --namespace "${SYSTEM_NS}" \
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

log "pushing load until the InferenceDeployment scales up"
cat <<YAML | k apply -n "${APP_NS}" -f -
apiVersion: batch/v1
kind: Job
metadata:
  name: e2e-load
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
                curl -s -o /dev/null "${SERVICE_URL}/completions" -H 'Content-Type: application/json' \
                  -d '{"model": "mock-smollm2", "prompt": "load", "max_tokens": 256, "ignore_eos": true}' &
                sleep 0.2
              done
              wait
YAML
scaled_up() {
  local replicas
  replicas="$(k get -n "${APP_NS}" "infd/${INFD}" -o jsonpath='{.spec.replicas}')"
  k get -n "${APP_NS}" "infd/${INFD}" --no-headers || true
  [[ "${replicas}" =~ ^[0-9]+$ ]] && ((replicas > 1))
}
wait_until "the HPA to scale ${INFD} above 1 replica" 600 scaled_up
k get -n "${APP_NS}" hpa "${INFD}"

log "stopping the load and waiting for the scale-down"
k delete -n "${APP_NS}" job e2e-load --wait=true
scaled_down() {
  local replicas
  replicas="$(k get -n "${APP_NS}" "infd/${INFD}" -o jsonpath='{.spec.replicas}')"
  k get -n "${APP_NS}" "infd/${INFD}" --no-headers || true
  [[ "${replicas}" == "1" ]]
}
wait_until "${INFD} to scale back to 1 replica" 900 scaled_down

log "deleting the InferenceDeployment removes its children"
k delete -n "${APP_NS}" "infd/${INFD}" --wait=true --timeout=5m
gone() {
  [[ -z "$(k get -n "${APP_NS}" deploy,svc,pdb,hpa -l "hetero-infer.io/inference-deployment=${INFD}" -o name)" ]]
}
wait_until "the children of ${INFD} to be deleted" 300 gone

log "e2e passed"
