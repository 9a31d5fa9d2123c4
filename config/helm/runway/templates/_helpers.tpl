{{- define "runway.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "runway.selector" -}}
app.kubernetes.io/name: runway
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "runway.labels" -}}
{{ include "runway.selector" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "runway.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}
{{- end -}}

{{/* The Secrets Runway may read: secrets.names and the forges' own. */}}
{{- define "runway.secretNames" -}}
{{- $names := .Values.secrets.names | default list -}}
{{- range .Values.forges -}}
{{- with .token }}{{ $names = append $names .name }}{{ end -}}
{{- with .githubConfigSecret }}{{ $names = append $names . }}{{ end -}}
{{- with .webhookSecret }}{{ $names = append $names .name }}{{ end -}}
{{- end -}}
{{- if has .Values.store.postgres.dsnSecret.name $names -}}
{{- fail (printf "secrets.names holds %s, the store's DSN: a RunnerGroup could name it and have Runway send the DSN to its URL" .Values.store.postgres.dsnSecret.name) -}}
{{- end -}}
{{- $names | uniq | join "," -}}
{{- end -}}

{{/* The namespaces watched: watchNamespaces, default the release's. */}}
{{- define "runway.watchNamespaces" -}}
{{- .Values.watchNamespaces | default (list .Release.Namespace) | uniq | join "," -}}
{{- end -}}
