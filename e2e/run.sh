#!/usr/bin/env bash
# End-to-end suite on a kind cluster: build and load the images, install Prometheus,
# prometheus-adapter (pinned chart versions) and the hetero-infer chart, then:
# - for each autoscaling mode, "hpa" (examples/hpa.yaml) and "operator" (the operator scrapes the workers
#   itself; the same pod resources and mock step latency as hpa.yaml): deploy a mock-executor
#   InferenceDeployment, send OpenAI requests through its Service, push load until it scales up, wait until
#   the added pods are Ready, stop the load, wait until the queue drains and it scales back down; deleting it
#   removes its children (no finalizer);
# - the router and scale to zero (examples/router.yaml, minReplicas 0, scaleToZeroAfterSeconds shortened):
#   idle, it scales to zero workers; a request held by the router is answered once a worker starts (timed);
#   a load of long streams runs through the router while the routers and the workers roll
#   (`kubectl rollout restart`): no request fails, no stream is cut; an operator upgrade (a new image tag)
#   restarts no router; idle again, it scales back to zero;
# - a model from a local Hub: e2e/local_hub.py (the model-source tests' Hub server, a private repository
#   holding a tiny random-weight llama) on the host, reached from the pods at the kind network's gateway;
#   spec.model.url hf://..., HF_ENDPOINT and HF_TOKEN from the credentials Secret; the init container
#   fetches it, the worker (torch executor, CPU) answers a completion;
# then tear everything down.
#
# Needs: docker (running), kind, kubectl, helm, network access for base images and charts, and a Python with
# the project's dev dependencies (torch, transformers, aiohttp) for the local Hub.
# `pytest e2e` skips with the reason when one of them is missing (as on the development machines).
# Usage: e2e/run.sh            (from anywhere; `pytest e2e` runs it too)
# Environment:
#   CLUSTER_NAME   kind cluster name                       (default hetero-infer-e2e)
#   KEEP_CLUSTER   1: leave the cluster running at the end  (default 0)
#   SKIP_BUILD     1: reuse images already built            (default 0)
#   HELM, KUBECTL, KIND, DOCKER, PYTHON   binaries to use   (default: from PATH; PYTHON: python3)
#   HUB_PORT       the local Hub's port on the host         (default 18765)
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
PYTHON="${PYTHON:-python3}"
HUB_PORT="${HUB_PORT:-18765}"

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
INFD_ROUTER="router-demo"
INFD_HUB="hub-tiny"
HUB_REPO="e2e/tiny-llama"
HUB_TOKEN="hf_e2e_token"
HUB_PID=""
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
  if [[ -n "${HUB_PID}" ]]; then
    kill "${HUB_PID}" 2> /dev/null || true
  fi
  if ((rc != 0)); then
    log "diagnostics (exit code ${rc})"
    k get infd,deploy,hpa,pods -A -o wide || true
    k describe infd -n "${APP_NS}" || true
    k get events -n "${APP_NS}" --sort-by=.lastTimestamp | tail -n 50 || true
    k logs -n "${SYSTEM_NS}" -l app.kubernetes.io/component=operator --tail=200 || true
  fi
  if [[ "${KEEP_CLUSTER}" != "1" ]]; then
    log "deleting kind cluster ${CLUSTER_NAME}"
    "${KIND}" delete cluster --name "${CLUSTER_NAME}" || true
  fi
  exit "${rc}"
}

for tool in "${DOCKER}" "${KIND}" "${KUBECTL}" "${HELM}" "${PYTHON}"; do
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
  --set routerImage="${OPERATOR_IMAGE_REPO}:${OPERATOR_IMAGE_TAG}" \
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
  # As examples/hpa.yaml: pods small enough that three fit the node, and steps slow enough that a queue builds.
  # No spec.replicas: the autoscaler owns it.
  resources:
    cpu: 250m
    memory: 2Gi
  engine:
    maxNumSeqs: 4
  env:
    - name: HETERO_INFER_MOCK_STEP_LATENCY_S
      value: "0.05"
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

# -- the router, scale to zero, rollouts under load, an operator upgrade --------------------------------------

# scaled_to_zero NAME: spec.replicas 0 and no worker pod left.
scaled_to_zero() {
  k get -n "${APP_NS}" "infd/$1" --no-headers || true
  [[ "$(spec_replicas "$1")" == "0" ]] \
    && [[ -z "$(k get -n "${APP_NS}" pods -l "hetero-infer.io/inference-deployment=$1,app.kubernetes.io/component=worker" -o name)" ]]
}

router_available() {
  local want ready
  want="$(k get -n "${APP_NS}" "deploy/$1-router" -o jsonpath='{.spec.replicas}')"
  ready="$(k get -n "${APP_NS}" "deploy/$1-router" -o jsonpath='{.status.availableReplicas}')"
  [[ -n "${want}" && "${ready}" == "${want}" ]]
}

# start_stream_load NAME SECONDS: a Job of 6 clients, each sending long streamed completions to NAME's Service
# one after another for SECONDS; a client exits 1 at the first request that fails, is cut (fewer tokens than
# asked, no final usage chunk) or lacks data: [DONE]; the Job then fails (backoffLimit 0).
start_stream_load() {
  local name="$1" seconds="$2"
  cat <<YAML | k apply -n "${APP_NS}" -f -
apiVersion: batch/v1
kind: Job
metadata:
  name: e2e-streams-${name}
spec:
  parallelism: 6
  completions: 6
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      securityContext:
        runAsNonRoot: true
        runAsUser: 100
      containers:
        - name: streams
          image: ${CURL_IMAGE}
          command: ["/bin/sh", "-c"]
          args:
            - |
              end=\$((\$(date +%s) + ${seconds}))
              n=0
              while [ "\$(date +%s)" -lt "\$end" ]; do
                out="\$(curl -sSfN --max-time 600 "http://${name}.${APP_NS}.svc/v1/completions" \\
                  -H 'Content-Type: application/json' \\
                  -d '{"model": "mock-smollm2", "prompt": "roll", "max_tokens": 100, "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}}')" \\
                  || { echo "request \$n failed"; exit 1; }
                echo "\$out" | grep -q '"completion_tokens":100' || { echo "request \$n cut: \$(echo "\$out" | tail -c 300)"; exit 1; }
                echo "\$out" | grep -q 'data: \[DONE\]' || { echo "request \$n: no [DONE]"; exit 1; }
                n=\$((n + 1))
              done
              echo "\$n streams complete"
YAML
}

# stream_load_finished NAME: every client of the Job ended, or one failed (backoffLimit 0 ends the Job then).
stream_load_finished() {
  local succeeded failed
  succeeded="$(k get -n "${APP_NS}" "job/e2e-streams-$1" -o jsonpath='{.status.succeeded}')"
  failed="$(k get -n "${APP_NS}" "job/e2e-streams-$1" -o jsonpath='{.status.failed}')"
  ((${succeeded:-0} + ${failed:-0} >= 6 || ${failed:-0} > 0))
}

# stream_load_passed NAME: the Job finished and every client's streams were complete.
stream_load_passed() {
  local job="e2e-streams-$1" succeeded
  wait_until "the stream load through $1 to finish" 900 stream_load_finished "$1"
  k logs -n "${APP_NS}" -l "job-name=${job}" --prefix --tail=3 || true
  succeeded="$(k get -n "${APP_NS}" "job/${job}" -o jsonpath='{.status.succeeded}')"
  [[ "${succeeded}" == "6" ]] || fail "the stream load through $1 lost requests (${succeeded:-0} of 6 clients passed)"
  k delete -n "${APP_NS}" "job/${job}" --wait=true
}

log "the router and scale to zero (examples/router.yaml, ${INFD_ROUTER})"
k apply -n "${APP_NS}" -f "${ROOT}/examples/router.yaml"
# Idle for 30 s instead of the example's 10 minutes, so the suite sees the scale-down to zero; mock steps of
# 50 ms, so a stream of 100 tokens lasts 5 s and the rollouts below happen while streams run.
k patch -n "${APP_NS}" "infd/${INFD_ROUTER}" --type merge -p '{"spec": {"autoscaling": {"scaleToZeroAfterSeconds": 30},
  "env": [{"name": "HETERO_INFER_MOCK_STEP_LATENCY_S", "value": "0.05"}]}}'
wait_until "the routers of ${INFD_ROUTER} to be available" 600 router_available "${INFD_ROUTER}"
k get -n "${APP_NS}" deploy,svc,pdb -l "hetero-infer.io/inference-deployment=${INFD_ROUTER}"
[[ "$(k get -n "${APP_NS}" "deploy/${INFD_ROUTER}-router" -o jsonpath='{.spec.replicas}')" == "2" ]] \
  || fail "the router does not run 2 replicas by default"
k get -n "${APP_NS}" "pdb/${INFD_ROUTER}-router" > /dev/null || fail "the router has no PodDisruptionBudget"
wait_until "${INFD_ROUTER} to scale to zero workers" 600 scaled_to_zero "${INFD_ROUTER}"

log "a request at zero workers is held by the router and answered once a worker is up"
ROUTER_URL="http://${INFD_ROUTER}.${APP_NS}.svc/v1"
started=${SECONDS}
reply="$(k run -n "${APP_NS}" e2e-from-zero --rm -i --restart=Never --quiet --image="${CURL_IMAGE}" -- \
  curl -sSf --max-time 600 "${ROUTER_URL}/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model": "mock-smollm2", "max_tokens": 8, "messages": [{"role": "user", "content": "Hello"}]}')"
grep -q '"choices"' <<< "${reply}" || fail "the request held at zero workers got no completion: ${reply}"
log "ok: answered from zero workers in $((SECONDS - started)) s (held by the router while a worker started)"
wait_until "${INFD_ROUTER} to run its worker" 300 all_ready "${INFD_ROUTER}"

log "rolling the routers and the workers under a load of long streams: no request fails, no stream is cut"
start_stream_load "${INFD_ROUTER}" 240
sleep 20
k rollout restart -n "${APP_NS}" "deploy/${INFD_ROUTER}-router"
k rollout status -n "${APP_NS}" "deploy/${INFD_ROUTER}-router" --timeout=10m
k rollout restart -n "${APP_NS}" "deploy/${INFD_ROUTER}"
k rollout status -n "${APP_NS}" "deploy/${INFD_ROUTER}" --timeout=10m
stream_load_passed "${INFD_ROUTER}"

log "an operator upgrade (a new operator image tag) restarts no router"
router_generation="$(k get -n "${APP_NS}" "deploy/${INFD_ROUTER}-router" -o jsonpath='{.metadata.generation}')"
"${DOCKER}" tag "${OPERATOR_IMAGE_REPO}:${OPERATOR_IMAGE_TAG}" "${OPERATOR_IMAGE_REPO}:${OPERATOR_IMAGE_TAG}-upgrade"
"${KIND}" load docker-image --name "${CLUSTER_NAME}" "${OPERATOR_IMAGE_REPO}:${OPERATOR_IMAGE_TAG}-upgrade"
h upgrade hetero-infer "${ROOT}/charts/hetero-infer" --namespace "${SYSTEM_NS}" --reuse-values \
  --set image.tag="${OPERATOR_IMAGE_TAG}-upgrade" --wait --timeout 5m
k rollout status -n "${SYSTEM_NS}" deploy -l app.kubernetes.io/component=operator --timeout=5m
sleep 30  # a resync of the new operator (resyncSeconds 15) has passed
[[ "$(k get -n "${APP_NS}" "deploy/${INFD_ROUTER}-router" -o jsonpath='{.metadata.generation}')" == "${router_generation}" ]] \
  || fail "the operator upgrade changed the router Deployment (it would restart every router)"

wait_until "${INFD_ROUTER} to scale back to zero when idle" 600 scaled_to_zero "${INFD_ROUTER}"
delete_and_check "${INFD_ROUTER}"

# -- a model from a local Hub ---------------------------------------------------------------------------------

log "a model from a local Hub (${HUB_REPO}, private, on the host) through spec.model.url hf://"
gateway="$("${DOCKER}" network inspect kind -f '{{range .IPAM.Config}}{{.Gateway}} {{end}}' \
  | tr ' ' '\n' | grep -E '^[0-9]+(\.[0-9]+){3}$' | head -n 1)"
[[ -n "${gateway}" ]] || fail "no IPv4 gateway on the kind network"
hub_log="$(mktemp)"
"${PYTHON}" "${ROOT}/e2e/local_hub.py" --host 0.0.0.0 --port "${HUB_PORT}" --repo "${HUB_REPO}" \
  --token "${HUB_TOKEN}" > "${hub_log}" 2>&1 &
HUB_PID=$!
hub_up() { grep -q "local hub serving" "${hub_log}"; }
wait_until "the local Hub to serve ${HUB_REPO}" 300 hub_up
k create secret generic -n "${APP_NS}" local-hub --from-literal=HF_ENDPOINT="http://${gateway}:${HUB_PORT}" \
  --from-literal=HF_TOKEN="${HUB_TOKEN}" --dry-run=client -o yaml | k apply -f -
cat <<YAML | k apply -n "${APP_NS}" -f -
apiVersion: hetero-infer.io/v1alpha1
kind: InferenceDeployment
metadata:
  name: ${INFD_HUB}
spec:
  model:
    name: ${HUB_REPO}
    url: hf://${HUB_REPO}
    credentialsSecret: local-hub
    downloadSize: 1Gi
  executor: torch
  replicas: 1
  resources:
    cpu: 500m
    memory: 2Gi
YAML
k wait -n "${APP_NS}" "infd/${INFD_HUB}" --for=condition=Ready --timeout=10m
fetched="$(k get -n "${APP_NS}" pods -l "hetero-infer.io/inference-deployment=${INFD_HUB},app.kubernetes.io/component=worker" \
  -o jsonpath='{.items[0].status.initContainerStatuses[0].state.terminated.exitCode}')"
[[ "${fetched}" == "0" ]] || fail "the fetch-model init container did not succeed (exit code: ${fetched:-none})"
# A completion, not a chat: the tiny model carries the default model's tokenizer files but no chat template.
reply="$(k run -n "${APP_NS}" e2e-hub-completion --rm -i --restart=Never --quiet --image="${CURL_IMAGE}" -- \
  curl -sSf --retry 10 --retry-all-errors "http://${INFD_HUB}.${APP_NS}.svc/v1/completions" \
  -H 'Content-Type: application/json' \
  -d "{\"model\": \"${HUB_REPO}\", \"max_tokens\": 8, \"ignore_eos\": true, \"prompt\": \"Hello\"}")"
grep -q '"completion_tokens":8' <<< "${reply}" || fail "the Hub model's completion is not 8 tokens: ${reply}"
delete_and_check "${INFD_HUB}"

log "e2e passed"
