{{/* Names and labels. */}}
{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "sluice.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "sluice.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sluice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/part-of: sluice
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* The labels of one component's objects: (dict "root" $ "component" "api"). */}}
{{- define "sluice.componentLabels" -}}
{{ include "sluice.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "api"). */}}
{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "sluice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "sluice.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "sluice.secretName" -}}
{{- default (printf "%s-credentials" (include "sluice.fullname" .)) .Values.secret.existingSecret -}}
{{- end -}}

{{- define "sluice.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "sluice.simulatorURL" -}}
{{- printf "http://%s-llmsim.%s.svc.cluster.local:%d" (include "sluice.fullname" .) .Release.Namespace (int .Values.simulator.port) -}}
{{- end -}}

{{/*
Shutdown bounds, in seconds. The longest answer is llm.timeout for each of
llm.max_attempts attempts; a stopping worker gets that long to finish the
streams it runs, so that no answer in flight is cut. Each process then gets
its own steps on top, and 30 s for closing connections.
*/}}
{{- define "sluice.workerStopSeconds" -}}
{{- mul (int .Values.llm.timeoutSeconds) (int .Values.llm.maxAttempts) -}}
{{- end -}}
{{- define "sluice.workerGraceSeconds" -}}
{{- add (include "sluice.workerStopSeconds" . | int) 30 -}}
{{- end -}}
{{- define "sluice.apiGraceSeconds" -}}
{{- add (int .Values.api.preStopSleepSeconds) (int .Values.api.drainDelaySeconds) (int .Values.api.shutdownTimeoutSeconds) (include "sluice.workerStopSeconds" . | int) 30 -}}
{{- end -}}

{{/*
The config file: .Values.config with what the chart derives from the other
values laid over it. Pools without endpoints get the simulator's Service.
*/}}
{{- define "sluice.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $derived := dict
  "api" (dict
    "addr" (printf "0.0.0.0:%d" (int .Values.api.port))
    "shutdown_timeout" (printf "%ds" (int .Values.api.shutdownTimeoutSeconds))
    "drain_delay" (printf "%ds" (int .Values.api.drainDelaySeconds))
    "trusted_proxies" .Values.api.trustedProxies)
  "metrics" (dict
    "addr" (printf "0.0.0.0:%d" (int .Values.api.metricsPort))
    "worker_addr" (printf "0.0.0.0:%d" (int .Values.worker.metricsPort)))
  "llm" (dict
    "timeout" (printf "%ds" (int .Values.llm.timeoutSeconds))
    "max_attempts" (int .Values.llm.maxAttempts))
  "temporal" (dict "worker_stop_timeout" (printf "%ss" (include "sluice.workerStopSeconds" .)))
-}}
{{- $cfg = mustMergeOverwrite $cfg $derived -}}
{{- if .Values.temporal.tls.enabled -}}
{{- $tls := dict "enabled" true "cert_file" "/etc/sluice/tls/temporal/tls.crt" "key_file" "/etc/sluice/tls/temporal/tls.key" -}}
{{- if .Values.temporal.tls.ca -}}{{- $_ := set $tls "ca_file" "/etc/sluice/tls/temporal/ca.crt" -}}{{- end -}}
{{- if .Values.temporal.tls.serverName -}}{{- $_ := set $tls "server_name" .Values.temporal.tls.serverName -}}{{- end -}}
{{- $_ := set $cfg.temporal "tls" $tls -}}
{{- end -}}
{{- $pools := default dict $cfg.pools -}}
{{- range $name := list "short" "long" -}}
{{- $pool := default dict (get $pools $name) -}}
{{- if not $pool.endpoints -}}
{{- if not $.Values.simulator.enabled -}}
{{- fail (printf "config.pools.%s.endpoints: list your LLM servers' URLs, or set simulator.enabled=true" $name) -}}
{{- end -}}
{{- $_ := set $pool "endpoints" (list (include "sluice.simulatorURL" $)) -}}
{{- end -}}
{{- $_ := set $pools $name $pool -}}
{{- end -}}
{{- $_ := set $cfg "pools" $pools -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/*
The Deployments the healer may scale (pools.*.scaler.kind kubernetes), as
a dict from namespace to the list of their names.
*/}}
{{- define "sluice.scaledDeployments" -}}
{{- $out := dict -}}
{{- range $name, $pool := (default dict .Values.config.pools) -}}
{{- $s := default dict $pool.scaler -}}
{{- if eq (default "none" $s.kind) "kubernetes" -}}
{{- $ns := default $.Release.Namespace $s.namespace -}}
{{- $_ := set $out $ns (append (default list (get $out $ns)) $s.deployment | uniq | sortAlpha) -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* The port of a host:port or of an http(s) URL. */}}
{{- define "sluice.port" -}}
{{- if contains "://" . -}}
{{- $u := urlParse . -}}
{{- if contains ":" $u.host -}}{{- splitList ":" $u.host | last -}}{{- else if eq $u.scheme "https" -}}443{{- else -}}80{{- end -}}
{{- else -}}
{{- splitList ":" . | last -}}
{{- end -}}
{{- end -}}

{{/* The environment both processes read their credentials from. */}}
{{- define "sluice.secretEnv" -}}
{{- $secret := include "sluice.secretName" . -}}
{{- $keys := .Values.secret.keys -}}
- name: SLUICE_REDIS_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ $secret }}, key: {{ $keys.redisPassword }}, optional: true}
- name: SLUICE_TEMPORAL_API_KEY
  valueFrom:
    secretKeyRef: {name: {{ $secret }}, key: {{ $keys.temporalAPIKey }}, optional: {{ not .Values.temporal.apiKey }}}
- name: SLUICE_POOLS_SHORT_API_KEY
  valueFrom:
    secretKeyRef: {name: {{ $secret }}, key: {{ $keys.shortPoolAPIKey }}, optional: true}
- name: SLUICE_POOLS_LONG_API_KEY
  valueFrom:
    secretKeyRef: {name: {{ $secret }}, key: {{ $keys.longPoolAPIKey }}, optional: true}
{{- if eq (dig "usage" "store" "off" (.Values.config | default dict)) "postgres" }}
- name: SLUICE_USAGE_POSTGRES_DSN
  valueFrom:
    secretKeyRef: {name: {{ $secret }}, key: {{ $keys.usagePostgresDSN }}, optional: true}
{{- end }}
{{- end -}}

{{/* Volumes both processes mount: config, /tmp, Temporal's TLS. */}}
{{- define "sluice.volumes" -}}
- name: config
  configMap:
    name: {{ include "sluice.fullname" . }}-config
- name: tmp
  emptyDir: {}
{{- if .Values.temporal.tls.enabled }}
- name: temporal-tls
  secret:
    secretName: {{ required "temporal.tls.existingSecret: name the Secret with tls.crt and tls.key" .Values.temporal.tls.existingSecret }}
{{- end }}
{{- end -}}

{{- define "sluice.volumeMounts" -}}
- name: config
  mountPath: /etc/sluice/config
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- if .Values.temporal.tls.enabled }}
- name: temporal-tls
  mountPath: /etc/sluice/tls/temporal
  readOnly: true
{{- end }}
{{- end -}}

{{/* Pod annotations that roll the pods when their config or Secret changes. */}}
{{- define "sluice.checksums" -}}
checksum/config: {{ include "sluice.config" . | sha256sum }}
{{- if not .Values.secret.existingSecret }}
checksum/secret: {{ include (print .Template.BasePath "/secret.yaml") . | sha256sum }}
{{- end }}
{{- end -}}
