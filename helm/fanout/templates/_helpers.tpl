{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "fanout.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: the release name, plus the chart name unless it contains it. */}}
{{- define "fanout.fullname" -}}
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

{{- define "fanout.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "fanout.labels" -}}
helm.sh/chart: {{ include "fanout.chart" . }}
{{ include "fanout.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "fanout.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fanout.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "fanout.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* Secret holding REDIS_URL, and its key. */}}
{{- define "fanout.redisSecretName" -}}
{{- .Values.redis.existingSecret | default (include "fanout.fullname" .) }}
{{- end }}

{{- define "fanout.redisSecretKey" -}}
{{- if .Values.redis.existingSecret }}{{ .Values.redis.existingSecretKey }}{{ else }}REDIS_URL{{ end }}
{{- end }}

{{/* Secret holding FANOUT_TOKEN_SECRET, FANOUT_API_KEYS and the provider keys. */}}
{{- define "fanout.secretName" -}}
{{- .Values.secrets.existingSecret | default (include "fanout.fullname" .) }}
{{- end }}

{{/* One env entry read from a Secret key: (dict "name" VAR "secret" NAME "key" KEY "optional" BOOL). */}}
{{- define "fanout.secretEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ .secret }}
      key: {{ .key | default .name }}
      optional: {{ .optional }}
{{- end }}

{{/*
Environment shared by both roles: REDIS_URL, OTEL_*, extraEnv. Argument: (dict "root" $ "component" NAME).
Role-specific settings live in the ConfigMap (envFrom), secrets come from secretKeyRef.
*/}}
{{- define "fanout.commonEnv" -}}
{{- $root := .root }}
{{- include "fanout.secretEnv" (dict "name" "REDIS_URL" "secret" (include "fanout.redisSecretName" $root) "key" (include "fanout.redisSecretKey" $root) "optional" false) }}
{{- if not (hasKey $root.Values.otel "OTEL_SERVICE_NAME") }}
- name: OTEL_SERVICE_NAME
  value: {{ printf "fanout-%s" .component | quote }}
{{- end }}
{{- range $name, $value := $root.Values.otel }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- if $root.Values.metrics.enabled }}
- name: OTEL_METRICS_EXPORTER
  value: prometheus
- name: OTEL_EXPORTER_PROMETHEUS_HOST
  value: "0.0.0.0"
- name: OTEL_EXPORTER_PROMETHEUS_PORT
  value: {{ $root.Values.metrics.port | quote }}
{{- end }}
{{- with $root.Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Fail early on values that cannot work. Renders nothing. */}}
{{- define "fanout.validate" -}}
{{- if not (or .Values.redis.url .Values.redis.existingSecret) }}
{{- fail "set redis.url or redis.existingSecret: this chart runs no Redis, bring your own" }}
{{- end }}
{{- if not .Values.secrets.existingSecret }}
{{- if not .Values.secrets.tokenSecret }}
{{- fail "set secrets.tokenSecret (32+ random characters, the same for every publisher: openssl rand -hex 32) or secrets.existingSecret" }}
{{- end }}
{{- if lt (len .Values.secrets.tokenSecret) 32 }}
{{- fail "secrets.tokenSecret must have at least 32 characters (or set secrets.existingSecret)" }}
{{- end }}
{{- end }}
{{- range $name, $value := .Values.config }}
{{- if not (hasPrefix "FANOUT_" $name) }}
{{- fail (printf "config.%s: only FANOUT_* settings belong in config (use extraEnv)" $name) }}
{{- end }}
{{- end }}
{{- range $name, $value := .Values.otel }}
{{- if not (hasPrefix "OTEL_" $name) }}
{{- fail (printf "otel.%s: only OTEL_* variables belong in otel (use extraEnv)" $name) }}
{{- end }}
{{- if and $.Values.metrics.enabled (has $name (list "OTEL_METRICS_EXPORTER" "OTEL_EXPORTER_PROMETHEUS_HOST" "OTEL_EXPORTER_PROMETHEUS_PORT")) }}
{{- fail (printf "otel.%s: metrics.enabled sets it; drop one of the two" $name) }}
{{- end }}
{{- end }}
{{- if hasKey .Values.config "FANOUT_UPSTREAMS_FILE" }}
{{- fail "config.FANOUT_UPSTREAMS_FILE: set upstreams.file (the TOML text) instead" }}
{{- end }}
{{- range .Values.upstreams.secretEnv }}
{{- if not (and .name .secretName .key) }}
{{- fail "upstreams.secretEnv: each entry needs name, secretName and key" }}
{{- end }}
{{- end }}
{{- range .Values.upstreams.secretFiles }}
{{- if not (and .name .secretName (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" .name)) }}
{{- fail "upstreams.secretFiles: each entry needs a name (lowercase letters, digits, '-') and a secretName" }}
{{- end }}
{{- end }}
{{- if hasKey .Values.config "FANOUT_REDIS_CLUSTER" }}
{{- fail "config.FANOUT_REDIS_CLUSTER: set redis.cluster instead" }}
{{- end }}
{{- if lt (int (include "fanout.jobShards" .)) 1 }}
{{- fail "config.FANOUT_JOB_SHARDS must be a whole number of at least 1" }}
{{- end }}
{{- if and .Values.metrics.enabled (eq (int .Values.metrics.port) (int .Values.publisher.port)) }}
{{- fail "metrics.port must differ from publisher.port" }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.enabled) }}
{{- fail "metrics.serviceMonitor.enabled needs metrics.enabled (the scrape port)" }}
{{- end }}
{{- if .Values.keda.enabled }}
{{- if .Values.worker.autoscaling.enabled }}
{{- fail "keda.enabled and worker.autoscaling.enabled both create an HPA for the workers: choose one" }}
{{- end }}
{{- if not .Values.keda.address }}
{{- fail "keda.address: KEDA needs host:port of Redis (it cannot read REDIS_URL)" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Jobs streams (FANOUT_JOB_SHARDS in config; the code's default is 1). */}}
{{- define "fanout.jobShards" -}}
{{- index .Values.config "FANOUT_JOB_SHARDS" | default 1 | int }}
{{- end }}

{{/* Pod-level settings shared by both Deployments. Argument: the component's values. */}}
{{- define "fanout.podScheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The upstreams file's volume mount and volume (both roles) and, with "secrets" true, the
workers' secret-file mounts and volumes. Argument: (dict "root" $ "secrets" BOOL).
*/}}
{{- define "fanout.upstreamsMounts" -}}
{{- $root := .root }}
{{- if $root.Values.upstreams.file }}
- name: upstreams
  mountPath: {{ $root.Values.upstreams.mountPath }}
  readOnly: true
{{- end }}
{{- if .secrets }}
{{- range $root.Values.upstreams.secretFiles }}
- name: {{ printf "secret-%s" .name }}
  mountPath: {{ printf "/etc/fanout/secrets/%s" .name }}
  readOnly: true
{{- end }}
{{- end }}
{{- end }}

{{- define "fanout.upstreamsVolumes" -}}
{{- $root := .root }}
{{- if $root.Values.upstreams.file }}
- name: upstreams
  configMap:
    name: {{ include "fanout.fullname" $root }}-upstreams
{{- end }}
{{- if .secrets }}
{{- range $root.Values.upstreams.secretFiles }}
- name: {{ printf "secret-%s" .name }}
  secret:
    secretName: {{ .secretName }}
{{- end }}
{{- end }}
{{- end }}
