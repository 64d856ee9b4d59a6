{{/* Names and labels shared by every template. */}}

{{- define "hetero-infer.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hetero-infer.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "hetero-infer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hetero-infer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "hetero-infer.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "hetero-infer.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: hetero-infer
{{- end }}

{{- define "hetero-infer.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "hetero-infer.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "hetero-infer.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "hetero-infer.peeringName" -}}
{{- default (include "hetero-infer.fullname" .) .Values.peering.name }}
{{- end }}

{{/* Labels of the worker pods the operator creates (operator/constants.py). */}}
{{- define "hetero-infer.workerSelector" -}}
app.kubernetes.io/managed-by: hetero-infer-operator
app.kubernetes.io/component: worker
{{- end }}

{{/* RBAC rules for the namespaced resources the operator manages. */}}
{{- define "hetero-infer.namespacedRules" -}}
- apiGroups: ["hetero-infer.io"]
  resources: ["inferencedeployments"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["hetero-infer.io"]
  resources: ["inferencedeployments/status"]
  verbs: ["get", "patch"]
- apiGroups: ["hetero-infer.io"]
  resources: ["inferencedeployments/finalizers"]
  verbs: ["update"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# spec.adapters: the ConfigMap that lists the LoRA adapters the workers load.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# spec.router: the router's ServiceAccount, Role and RoleBinding. The API server lets the operator grant
# only what it holds itself (RBAC escalation check), hence the endpointslices read below; no escalate/bind.
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch"]
# ... and, for a router that scales its model from zero, the scale of that InferenceDeployment.
- apiGroups: ["hetero-infer.io"]
  resources: ["inferencedeployments/scale"]
  verbs: ["get", "patch"]
# spec.router.inferencePool (Gateway API Inference Extension).
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["get", "create", "patch", "delete"]
# spec.service.ingress and spec.service.httpRoute (Gateway API).
- apiGroups: ["networking.k8s.io"]
  resources: ["ingresses"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["httproutes"]
  verbs: ["get", "create", "patch", "delete"]
# Autoscaling mode operator and spec.adapters (which adapters each worker serves): find the worker pods (podIP) to
# scrape their /metrics; spec.model.cache: the download Job's pods (why one failed) and the running one's log (its
# progress lines).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list"]
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
# spec.model.cache: the download Job (never patched: a Job's pod template is immutable) and the cache's claim.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "delete"]
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
{{- if .Values.peering.enabled }}
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- end }}

{{/* The cluster router's pods (templates/cluster-router.yaml). */}}
{{- define "hetero-infer.clusterRouterSelector" -}}
app.kubernetes.io/name: {{ include "hetero-infer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: cluster-router
{{- end }}

{{- define "hetero-infer.clusterRouterLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "hetero-infer.clusterRouterSelector" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: hetero-infer
{{- end }}
