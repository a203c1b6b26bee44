{{/* Chart name, overridable. */}}
{{- define "kvferry.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name of the operator's objects: the release name, with the chart name unless it already has it. */}}
{{- define "kvferry.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "kvferry.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kvferry.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels that select pods: stable across upgrades (a Deployment's selector is immutable). */}}
{{- define "kvferry.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvferry.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kvferry.labels" -}}
helm.sh/chart: {{ include "kvferry.chart" . }}
{{ include "kvferry.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kvferry
{{- end -}}

{{- define "kvferry.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kvferry.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kvferry.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/*
Everything the operator does to InferenceClusters and their children, and nothing else:
- read and watch InferenceClusters, patch them (kopf's bookkeeping annotations) and their status;
  update their finalizers subresource, which setting blockOwnerDeletion on children requires;
- create, server-side apply, read, list (prune) and delete the children it owns; watch Deployments for status;
- read pods and EndpointSlices: it grants exactly that to each cluster's router Role, and RBAC only lets
  a subject grant permissions it holds itself;
- create Events (kopf reports handler failures as Kubernetes Events).
*/}}
{{- define "kvferry.operatorRules" -}}
- apiGroups: [kvferry.dev]
  resources: [inferenceclusters]
  verbs: [get, list, watch, patch]
- apiGroups: [kvferry.dev]
  resources: [inferenceclusters/status]
  verbs: [get, patch]
- apiGroups: [kvferry.dev]
  resources: [inferenceclusters/finalizers]
  verbs: [update]
- apiGroups: [""]
  resources: [configmaps, services, serviceaccounts]
  verbs: [get, list, create, patch, delete]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, list, create, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, create, patch, delete]
- apiGroups: [""]
  resources: [secrets]
  verbs: [create, patch]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create]
{{- end -}}

{{/*
The namespaces the operator manages, comma-separated: operator.watchNamespaces, else the release namespace;
empty with operator.clusterWide (every namespace).
*/}}
{{- define "kvferry.watchNamespaces" -}}
{{- if .Values.operator.clusterWide -}}
{{- if .Values.operator.watchNamespaces -}}
{{- fail "set operator.clusterWide or operator.watchNamespaces, not both" -}}
{{- end -}}
{{- else if .Values.operator.watchNamespaces -}}
{{- join "," .Values.operator.watchNamespaces -}}
{{- else -}}
{{- .Release.Namespace -}}
{{- end -}}
{{- end }}
