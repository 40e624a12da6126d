{{/*
Named templates for adding the leader-elector sidecar to your own chart's Pods.

Add this chart as a dependency (Chart.yaml):

  dependencies:
    - name: leader-elector
      version: 0.1.0
      repository: <where you publish it>   # or file://../leader-elector

and configure it under the `leader-elector` key of your values:

  leader-elector:
    election: billing-scheduler
    etcd:
      endpoints: ["http://etcd.infra:2379"]
    example:
      enabled: false          # no example workload
    serviceAccount:
      create: false
      name: billing-scheduler # your Pods' ServiceAccount; the chart binds its Role to it
    podSelector:              # your Pods' labels, for the leader Service
      app.kubernetes.io/name: billing-scheduler
    service:
      targetPort: http        # your app's port name

Then, in your Deployment's Pod spec, pass these values together with .Release
and .Chart to the templates:

  {{- $le := dict "Values" (index .Values "leader-elector") "Release" .Release "Chart" .Chart }}
  spec:
    serviceAccountName: billing-scheduler
    containers:
      - name: app
        ...
      {{- include "leader-elector.sidecar" $le | nindent 6 }}
    volumes:
      {{- include "leader-elector.volumes" $le | nindent 6 }}

With `nativeSidecar: true` (Kubernetes >= 1.29) put the sidecar under
`initContainers:` instead of `containers:` (it then carries
`restartPolicy: Always`): it starts before your app and stops after it.

`leader-elector.sidecar` renders one list item (the container);
`leader-elector.volumes` renders zero or more list items (the TLS and password
Secrets), so it can stand beside your own volumes. RBAC: keep `rbac.create`
true (the sub-chart creates the Role and binds it to serviceAccount.name), or
put `include "leader-elector.rbacRules"` in your own Role.

The sidecar's HTTP API is on localhost:<httpPort> (4040): your app asks
GET /leader (200 = act, 503 = stand by).
*/}}

{{/*
The sidecar container, as one item of a Pod's `containers` list.
*/}}
{{- define "leader-elector.sidecar" -}}
{{- include "leader-elector.sidecar.body" . | trim }}
{{- end }}

{{- define "leader-elector.sidecar.body" -}}
{{- $v := .Values }}
{{- $etcd := and (has $v.backend (list "auto" "etcd")) $v.etcd.endpoints }}
{{- $sentinel := and (has $v.backend (list "auto" "redis")) $v.redis.sentinel.hosts }}
{{- $redis := and (has $v.backend (list "auto" "redis")) (or $v.redis.urlsSecret.name $v.redis.sentinel.hosts) }}
{{- if and $sentinel $v.redis.urlsSecret.name }}
{{- fail "leader-elector: both redis.urlsSecret.name and redis.sentinel.hosts are set: the Sentinels name the one primary; drop redis.urlsSecret" }}
{{- end }}
{{- if and $v.redis.cluster $v.redis.sentinel.hosts }}
{{- fail "leader-elector: both redis.cluster and redis.sentinel.hosts are set: a Redis Cluster fails over by itself; drop redis.sentinel" }}
{{- end }}
{{- if and $v.redis.cluster (not $v.redis.urlsSecret.name) }}
{{- fail "leader-elector: redis.cluster needs redis.urlsSecret.name (the Secret with the cluster's seed redis:// URLs)" }}
{{- end }}
{{- if and $sentinel (not $v.redis.sentinel.master) }}
{{- fail "leader-elector: redis.sentinel.hosts needs redis.sentinel.master (the NAME in `sentinel monitor NAME ...`, e.g. mymaster)" }}
{{- end }}
{{- if and (eq $v.backend "etcd") (not $etcd) }}
{{- fail "leader-elector: backend \"etcd\" needs etcd.endpoints" }}
{{- end }}
{{- if and (eq $v.backend "redis") (not $redis) }}
{{- fail "leader-elector: backend \"redis\" needs redis.urlsSecret.name or redis.sentinel.hosts" }}
{{- end }}
{{- $leaseMs := include "leader-elector.durationMs" $v.leaseDuration | int64 }}
{{- if lt $leaseMs 1000 }}
{{- fail (printf "leader-elector: leaseDuration (%s) must be at least 1s" $v.leaseDuration) }}
{{- end }}
{{- with $v.renewInterval }}
{{- if ge (include "leader-elector.durationMs" . | int64) $leaseMs }}
{{- fail (printf "leader-elector: renewInterval (%s) must be shorter than leaseDuration (%s): the lease would expire between renewals and the sidecar refuses to start" . $v.leaseDuration) }}
{{- end }}
{{- end }}
{{- include "leader-elector.checkRollout" . }}
{{- if and $v.migrateFromEndpoints (not (include "leader-elector.usesLeases" .)) }}
{{- fail "leader-elector: migrateFromEndpoints needs the Kubernetes Lease backend (the old image elected through the Kubernetes API); it cannot bridge to etcd or Redis" }}
{{- end }}
{{- if $v.failsafe.enabled }}
{{- if $v.migrateFromEndpoints }}
{{- fail "leader-elector: failsafe.enabled cannot be used with migrateFromEndpoints: the old image holding the Endpoints lock keeps no failsafe promise; finish the migration first" }}
{{- end }}
{{- if not $v.failsafe.secretName }}
{{- fail "leader-elector: failsafe.enabled needs failsafe.secretName (a Secret whose key `secret` holds at least 16 random bytes, the same for every member)" }}
{{- end }}
{{- if not $v.networkPolicy.enabled }}
{{- fail "leader-elector: failsafe.enabled needs networkPolicy.enabled: the peer port must be reachable only from the Pods of this release" }}
{{- end }}
{{- if eq (int $v.failsafe.peerPort) (int $v.httpPort) }}
{{- fail (printf "leader-elector: failsafe.peerPort (%v) is httpPort too: the peer listener and the HTTP API cannot share a port; choose another failsafe.peerPort (the default is 4042)" $v.failsafe.peerPort) }}
{{- end }}
{{- end }}
{{- if and $etcd $redis }}
{{- fail "leader-elector: both etcd.endpoints and a Redis (redis.urlsSecret.name or redis.sentinel.hosts) are set: choose one with backend=etcd or backend=redis (the backend is fixed at start-up)" }}
{{- end }}
{{- if $etcd }}
{{- if and $v.etcd.auth.username (not $v.etcd.auth.passwordSecret.name) }}
{{- fail "leader-elector: etcd.auth.username is set but etcd.auth.passwordSecret.name is empty" }}
{{- end }}
{{- range $v.etcd.endpoints }}
{{- if and $v.etcd.tls.secretName (not (hasPrefix "https://" .)) }}
{{- fail (printf "leader-elector: etcd.endpoints (%s) must use https:// when etcd.tls.secretName is set" .) }}
{{- end }}
{{- if and (not $v.etcd.tls.secretName) (hasPrefix "https://" .) }}
{{- fail (printf "leader-elector: etcd.endpoints (%s) uses https:// but etcd.tls.secretName (the CA) is not set" .) }}
{{- end }}
{{- end }}
{{- end }}
- name: leader-elector
  image: {{ include "leader-elector.image" . | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  {{- if $v.nativeSidecar }}
  # Native sidecar (an init container that keeps running): starts before the
  # app containers, once its startupProbe passes, and stops after them.
  restartPolicy: Always
  {{- end }}
  {{- with $v.extraArgs }}
  args:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  env:
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    - name: POD_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
    - name: LEADER_ELECTOR_ELECTION
      value: {{ include "leader-elector.election" . | quote }}
    - name: LEADER_ELECTOR_BACKEND
      value: {{ $v.backend | quote }}
    {{- if $etcd }}
    - name: LEADER_ELECTOR_ETCD_ENDPOINTS
      value: {{ join "," $v.etcd.endpoints | quote }}
    {{- with $v.etcd.prefix }}
    - name: LEADER_ELECTOR_ETCD_PREFIX
      value: {{ . | quote }}
    {{- end }}
    {{- if $v.etcd.tls.secretName }}
    - name: LEADER_ELECTOR_ETCD_CA_FILE
      value: /etc/leader-elector/etcd-tls/ca.crt
    {{- if $v.etcd.tls.clientCertificate }}
    - name: LEADER_ELECTOR_ETCD_CERT_FILE
      value: /etc/leader-elector/etcd-tls/tls.crt
    - name: LEADER_ELECTOR_ETCD_KEY_FILE
      value: /etc/leader-elector/etcd-tls/tls.key
    {{- end }}
    {{- end }}
    {{- if $v.etcd.auth.username }}
    - name: LEADER_ELECTOR_ETCD_USERNAME
      value: {{ $v.etcd.auth.username | quote }}
    - name: LEADER_ELECTOR_ETCD_PASSWORD_FILE
      value: /etc/leader-elector/etcd-auth/password
    {{- end }}
    {{- end }}
    {{- if $sentinel }}
    - name: LEADER_ELECTOR_REDIS_SENTINEL
      value: {{ join "," $v.redis.sentinel.hosts | quote }}
    - name: LEADER_ELECTOR_REDIS_SENTINEL_MASTER
      value: {{ $v.redis.sentinel.master | quote }}
    {{- else if $redis }}
    - name: LEADER_ELECTOR_REDIS_URL
      valueFrom:
        secretKeyRef:
          name: {{ $v.redis.urlsSecret.name | quote }}
          key: {{ $v.redis.urlsSecret.key | quote }}
    {{- if $v.redis.cluster }}
    - name: LEADER_ELECTOR_REDIS_CLUSTER
      value: "true"
    {{- end }}
    {{- end }}
    - name: LEADER_ELECTOR_LEASE_DURATION
      value: {{ $v.leaseDuration | quote }}
    {{- with $v.renewInterval }}
    - name: LEADER_ELECTOR_RENEW_INTERVAL
      value: {{ . | quote }}
    {{- end }}
    - name: LEADER_ELECTOR_PRIORITY
      value: {{ $v.priority | int64 | toString | quote }}
    - name: LEADER_ELECTOR_PREEMPT_AFTER
      value: {{ $v.preemptAfter | quote }}
    {{- if $v.shards }}
    - name: LEADER_ELECTOR_SHARDS
      value: {{ $v.shards | int64 | toString | quote }}
    {{- end }}
    {{- if $v.revisionFromPodTemplateHash }}
    # The ReplicaSet's hash of the Pod template: a new one per rollout.
    - name: LEADER_ELECTOR_REVISION
      valueFrom:
        fieldRef:
          fieldPath: metadata.labels['pod-template-hash']
    {{- end }}
    {{- with $v.maxClockSkew }}
    - name: LEADER_ELECTOR_MAX_CLOCK_SKEW
      value: {{ . | quote }}
    {{- end }}
    {{- if $v.migrateFromEndpoints }}
    - name: LEADER_ELECTOR_MIGRATE_FROM_ENDPOINTS
      value: "true"
    {{- end }}
    {{- with include "leader-elector.endpointSliceService" . }}
    - name: LEADER_ELECTOR_ENDPOINTSLICE_SERVICE
      value: {{ . | quote }}
    - name: POD_IP
      valueFrom:
        fieldRef:
          fieldPath: status.podIP
    - name: NODE_NAME
      valueFrom:
        fieldRef:
          fieldPath: spec.nodeName
    {{- end }}
    - name: LEADER_ELECTOR_HTTP_ADDR
      value: {{ printf "0.0.0.0:%d" (int $v.httpPort) | quote }}
    {{- if $v.failsafe.enabled }}
    # Failsafe: the peer listener on the Pod IP (the heartbeat only).
    - name: POD_IP
      valueFrom:
        fieldRef:
          fieldPath: status.podIP
    - name: LEADER_ELECTOR_FAILSAFE
      value: "true"
    - name: LEADER_ELECTOR_PEER_ADDR
      value: {{ printf "$(POD_IP):%d" (int $v.failsafe.peerPort) | quote }}
    - name: LEADER_ELECTOR_FAILSAFE_SECRET_FILE
      value: /etc/leader-elector/failsafe/secret
    {{- if $v.failsafe.acceptedSecretKey }}
    - name: LEADER_ELECTOR_FAILSAFE_ACCEPTED_SECRET_FILE
      value: /etc/leader-elector/failsafe/accepted
    {{- end }}
    {{- if $v.failsafe.maxOutage }}
    - name: LEADER_ELECTOR_FAILSAFE_MAX_OUTAGE
      value: {{ $v.failsafe.maxOutage | quote }}
    {{- end }}
    {{- end }}
    - name: LEADER_ELECTOR_LOG_FORMAT
      value: {{ $v.logFormat | quote }}
    - name: LEADER_ELECTOR_LOG_LEVEL
      value: {{ $v.logLevel | quote }}
    # Empty turns labelling off.
    - name: LEADER_ELECTOR_POD_LABEL_KEY
      value: {{ $v.podLabelKey | quote }}
    {{- with $v.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: leader-http
      containerPort: {{ $v.httpPort }}
      protocol: TCP
    {{- if $v.failsafe.enabled }}
    - name: leader-peer
      containerPort: {{ $v.failsafe.peerPort }}
      protocol: TCP
    {{- end }}
  {{- with $v.startupProbe }}
  startupProbe:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.livenessProbe }}
  livenessProbe:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.readinessProbe }}
  readinessProbe:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if or $v.failsafe.enabled (and $etcd (or $v.etcd.tls.secretName $v.etcd.auth.username)) }}
  volumeMounts:
    {{- if $v.failsafe.enabled }}
    - name: leader-elector-failsafe
      mountPath: /etc/leader-elector/failsafe
      readOnly: true
    {{- end }}
    {{- if $v.etcd.tls.secretName }}
    - name: leader-elector-etcd-tls
      mountPath: /etc/leader-elector/etcd-tls
      readOnly: true
    {{- end }}
    {{- if $v.etcd.auth.username }}
    - name: leader-elector-etcd-auth
      mountPath: /etc/leader-elector/etcd-auth
      readOnly: true
    {{- end }}
  {{- end }}
{{- end }}

{{/*
The sidecar's volumes, as zero or more items of a Pod's `volumes` list.
Files are mode 0444 (292): readable by the sidecar's non-root user even in
Pods without an fsGroup.
*/}}
{{- define "leader-elector.volumes" -}}
{{- include "leader-elector.volumes.body" . | trim }}
{{- end }}

{{- define "leader-elector.volumes.body" -}}
{{- $v := .Values }}
{{- if $v.failsafe.enabled }}
- name: leader-elector-failsafe
  secret:
    secretName: {{ $v.failsafe.secretName | quote }}
    defaultMode: 292
    items:
      - key: secret
        path: secret
      {{- with $v.failsafe.acceptedSecretKey }}
      - key: {{ . | quote }}
        path: accepted
      {{- end }}
{{- end }}
{{- if and (ne $v.backend "redis") $v.etcd.endpoints }}
{{- if $v.etcd.tls.secretName }}
- name: leader-elector-etcd-tls
  secret:
    secretName: {{ $v.etcd.tls.secretName | quote }}
    defaultMode: 292
    items:
      - key: ca.crt
        path: ca.crt
      {{- if $v.etcd.tls.clientCertificate }}
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
      {{- end }}
{{- end }}
{{- if $v.etcd.auth.username }}
- name: leader-elector-etcd-auth
  secret:
    secretName: {{ $v.etcd.auth.passwordSecret.name | quote }}
    defaultMode: 292
    items:
      - key: {{ $v.etcd.auth.passwordSecret.key | quote }}
        path: password
{{- end }}
{{- end }}
{{- end }}
