{{/*
Expand the name of the chart.
*/}}
{{- define "leader-elector.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Create a default fully qualified app name.
We truncate at 63 chars because some Kubernetes name fields are limited to this (by the DNS naming spec).
If release name contains chart name it will be used as a full name.
*/}}
{{- define "leader-elector.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Create chart name and version as used by the chart label.
*/}}
{{- define "leader-elector.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Common labels
*/}}
{{- define "leader-elector.labels" -}}
helm.sh/chart: {{ include "leader-elector.chart" . }}
{{ include "leader-elector.selectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Selector labels
*/}}
{{- define "leader-elector.selectorLabels" -}}
app.kubernetes.io/name: {{ include "leader-elector.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Labels that select the Pods running the sidecar: the example workload's, or
.Values.podSelector when the example is off.
*/}}
{{- define "leader-elector.podSelectorLabels" -}}
{{- if .Values.example.enabled }}
{{- include "leader-elector.selectorLabels" . }}
{{- else if .Values.podSelector }}
{{- toYaml .Values.podSelector }}
{{- else }}
{{- fail "podSelector must name your workload's Pod labels when example.enabled is false and a Service or PodMonitor is enabled" }}
{{- end }}
{{- end }}

{{/*
Create the name of the service account to use
*/}}
{{- define "leader-elector.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "leader-elector.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The election name: .Values.election, else the full name.
*/}}
{{- define "leader-elector.election" -}}
{{- default (include "leader-elector.fullname" .) .Values.election }}
{{- end }}

{{/*
The leader-elector release this chart deploys by default. Kept equal to
Chart.yaml's appVersion (scripts/check-k8s checks it); used when the sidecar
template is included from another chart, whose .Chart is not ours.
*/}}
{{- define "leader-elector.defaultAppVersion" -}}
0.1.0
{{- end }}

{{/*
The sidecar image: image.tag, else this chart's appVersion.
*/}}
{{- define "leader-elector.image" -}}
{{- $tag := .Values.image.tag }}
{{- if not $tag }}
{{- if and .Chart (eq .Chart.Name "leader-elector") }}
{{- $tag = .Chart.AppVersion }}
{{- else }}
{{- $tag = include "leader-elector.defaultAppVersion" . }}
{{- end }}
{{- end }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}

{{/*
RBAC rules the sidecar needs, for your own Role:
  rules:
    {{- include "leader-elector.rbacRules" . | nindent 4 }}
*/}}
{{/*
"true" when the sidecar elects through a Kubernetes Lease: backend
kubernetes, or auto with neither etcd endpoints nor a Redis URLs Secret nor
Redis Sentinels.
*/}}
{{- define "leader-elector.usesLeases" -}}
{{- $v := .Values }}
{{- if or (eq $v.backend "kubernetes") (and (eq $v.backend "auto") (not $v.etcd.endpoints) (not $v.redis.urlsSecret.name) (not $v.redis.sentinel.hosts)) }}true{{ end }}
{{- end }}

{{/*
The Service whose EndpointSlice the leader keeps (endpointSlice.enabled):
endpointSlice.service, else the chart's Service; empty when off.
*/}}
{{- define "leader-elector.endpointSliceService" -}}
{{- $e := .Values.endpointSlice }}
{{- if $e.enabled }}
{{- if $e.service }}{{ $e.service }}
{{- else if .Values.service.enabled }}{{ include "leader-elector.fullname" . }}
{{- else }}{{ fail "endpointSlice.enabled needs endpointSlice.service, or service.enabled (the chart's Service)" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
What the sidecar asks of the API server in its namespace, as RBAC rules:
the Role grants them and the FlowSchema (flowControl.enabled) matches them,
both rendered from this one list.
*/}}
{{- define "leader-elector.rbacRules" -}}
# Label its own Pod (JSON merge patch on metadata.labels), and find the
# Pods labelled leader to clear a dead leader's label. No get: it never
# reads one Pod.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "patch"]
# Record leadership transitions as Events on its Pod.
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create"]
{{- if include "leader-elector.usesLeases" . }}
# The election Lease (Kubernetes backend): read and follow it, create it once,
# update it by compare-and-swap on resourceVersion. `create` cannot be
# restricted by resourceNames (the name is not known to RBAC before creation).
# The same verbs keep each sidecar's candidate Lease
# (<election>-candidate-<suffix>, listed by label), plus `delete` to
# withdraw it on shutdown. The coordination API's Leases (le-lock-*,
# le-sem-*, le-job-*) use the same verbs, `delete` for completed jobs'
# Leases after --completed-retention (with the version read as precondition).
# Failsafe (failsafe.enabled) on Leases needs no more: the roster is an
# annotation of the election Lease written with each update, and each
# member's application a Lease of its own (<election>-failsafe-<suffix>,
# listed by label, deleted on shutdown).
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "list", "watch", "create", "update", "delete"]
{{- if .Values.migrateFromEndpoints }}
# The archived leader-elector image's lock (migrateFromEndpoints): the
# Endpoints object named after the election, read, created once and updated
# by compare-and-swap on resourceVersion; followers poll it (no watch).
- apiGroups: [""]
  resources: ["endpoints"]
  verbs: ["get", "create", "update"]
{{- end }}
{{- end }}
{{- if include "leader-elector.endpointSliceService" . }}
# The leader's EndpointSlice (endpointSlice.enabled): read, create, and
# replace it by compare-and-swap (emptied, never deleted: it goes with the
# Service it is owned by); read the Service for its ports.
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "create", "update"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get"]
{{- end }}
{{- end }}

{{/*
A duration value (whole numbers with units ms, s, m, h, d, e.g. "1m30s";
values.schema.json restricts it to that) in milliseconds.
*/}}
{{- define "leader-elector.durationMs" -}}
{{- $units := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 "d" 86400000 }}
{{- $total := 0 }}
{{- range regexFindAll "[0-9]+\\s*(ms|s|m|h|d)" (toString .) -1 }}
{{- $n := regexFind "^[0-9]+" . | int64 }}
{{- $unit := regexReplaceAll "^[0-9]+\\s*" . "" }}
{{- $total = add $total (mul $n (get $units $unit)) }}
{{- end }}
{{- $total }}
{{- end }}

{{/*
Refuse a readiness probe that only the leader passes (/leader, /isLeader, /)
where it deadlocks: followers are never ready, so a PodDisruptionBudget
never allows an eviction (only the leader counts as healthy), and a rolling
update ends with the old leader as the only available Pod, which it takes
down only when maxUnavailable covers every replica; until then the new Pods
stay unready (they follow the old leader), so the rollout never ends. Readiness is /readyz (followers
are ready); leader-only routing is the leader label (service.yaml).
*/}}
{{- define "leader-elector.checkRollout" -}}
{{- $v := .Values }}
{{- $path := "" }}
{{- with $v.readinessProbe }}{{ with .httpGet }}{{ $path = .path | default "" }}{{ end }}{{ end }}
{{- if and $v.example.enabled (has $path (list "/leader" "/isLeader" "/")) }}
{{- if $v.podDisruptionBudget.enabled }}
{{- fail (printf "leader-elector: readinessProbe on %s with podDisruptionBudget.enabled: only the leader is ever ready, so the PodDisruptionBudget never allows an eviction and every drain hangs; use /readyz (followers are ready) and route to the leader with the leader label (service.enabled)" $path) }}
{{- end }}
{{- $strategy := $v.example.strategy | default dict }}
{{- if ne ($strategy.type | default "RollingUpdate") "Recreate" }}
{{- $rolling := $strategy.rollingUpdate | default dict }}
{{- $max := toString (hasKey $rolling "maxUnavailable" | ternary $rolling.maxUnavailable "25%") }}
{{- $n := int $v.example.replicas }}
{{- $down := hasSuffix "%" $max | ternary (div (mul $n (atoi (trimSuffix "%" $max))) 100) (atoi $max) }}
{{- if lt (int $down) $n }}
{{- fail (printf "leader-elector: readinessProbe on %s with a rolling update (maxUnavailable %s of %d replicas): the old leader ends as the only available Pod, the new Pods stay unready while it leads, and a rolling update takes it down only when maxUnavailable covers every replica, so the rollout never ends; use /readyz (followers are ready) and route to the leader with the leader label, or example.strategy.type Recreate" $path $max $n) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
