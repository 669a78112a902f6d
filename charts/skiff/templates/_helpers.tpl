{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "skiff.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: the release name, unless it does not contain the chart name. */}}
{{- define "skiff.fullname" -}}
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

{{- define "skiff.operatorName" -}}
{{- printf "%s-operator" (include "skiff.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "skiff.routerName" -}}
{{- printf "%s-router" (include "skiff.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "skiff.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object; pass a dict with "ctx" (the root) and "component". */}}
{{- define "skiff.labels" -}}
helm.sh/chart: {{ include "skiff.chart" .ctx }}
{{ include "skiff.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: skiff
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
{{- end }}

{{- define "skiff.selectorLabels" -}}
app.kubernetes.io/name: {{ include "skiff.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end }}

{{- define "skiff.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "skiff.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "skiff.routerServiceAccountName" -}}
{{- include "skiff.routerName" . }}
{{- end }}

{{/* image reference "repository:tag"; pass a dict with "image" and "ctx". */}}
{{- define "skiff.image" -}}
{{- printf "%s:%s" .image.repository (default .ctx.Chart.AppVersion .image.tag) }}
{{- end }}

{{- define "skiff.routerImage" -}}
{{- $img := dict "repository" (default .Values.image.repository .Values.router.image.repository) "tag" (default .Values.image.tag .Values.router.image.tag) }}
{{- include "skiff.image" (dict "image" $img "ctx" .) }}
{{- end }}

{{/* The namespaces the operator and the router watch; empty list = all namespaces. */}}
{{- define "skiff.watchNamespaces" -}}
{{- if .Values.operator.watchNamespaces }}
{{- toJson .Values.operator.watchNamespaces }}
{{- else if .Values.rbac.clusterWide }}
{{- toJson list }}
{{- else }}
{{- toJson (list .Release.Namespace) }}
{{- end }}
{{- end }}

{{/* An alert's labels: its severity, then alerts.alertLabels; pass a dict with "ctx" and "severity". */}}
{{- define "skiff.alertLabels" -}}
severity: {{ .severity }}
{{- with .ctx.Values.alerts.alertLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* A NetworkPolicyPeer for this release's pods of one component; pass a dict with "ctx" and "component". */}}
{{- define "skiff.peer" -}}
{{- $pods := include "skiff.selectorLabels" . | fromYaml }}
{{- toJson (dict "namespaceSelector" (dict "matchLabels" (dict "kubernetes.io/metadata.name" .ctx.Release.Namespace)) "podSelector" (dict "matchLabels" $pods)) }}
{{- end }}

{{/* The metrics scraper as a NetworkPolicyPeer (networkPolicy.metricsScraper, empty selectors left out). */}}
{{- define "skiff.scraperPeer" -}}
{{- $peer := dict }}
{{- with .Values.networkPolicy.metricsScraper.namespaceSelector }}{{ $_ := set $peer "namespaceSelector" . }}{{ end }}
{{- with .Values.networkPolicy.metricsScraper.podSelector }}{{ $_ := set $peer "podSelector" . }}{{ end }}
{{- toJson $peer }}
{{- end }}

{{/* Whether the release renders NetworkPolicies: only with the router, the one way in they leave open. */}}
{{- define "skiff.networkPolicies" -}}
{{- if and .Values.router.enabled .Values.networkPolicy.enabled }}true{{ end }}
{{- end }}

{{/* The operator's --network-policy: who may reach the model pods' API port and their metrics port. */}}
{{- define "skiff.modelPolicyJson" -}}
{{- $router := include "skiff.peer" (dict "ctx" . "component" "router") | fromJson }}
{{- $operator := include "skiff.peer" (dict "ctx" . "component" "operator") | fromJson }}
{{- $scraper := include "skiff.scraperPeer" . | fromJson }}
{{- $metrics := list $operator }}
{{- if $scraper }}{{ $metrics = append $metrics $scraper }}{{ end }}
{{- toJson (dict "apiFrom" (list $router) "metricsFrom" $metrics) }}
{{- end }}
