{{- define "clb-probe.namespace" -}}
{{- if .Values.namespace.create }}{{ .Values.namespace.name }}{{ else }}{{ .Release.Namespace }}{{ end -}}
{{- end }}

{{- define "clb-probe.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}{{ default .Release.Name .Values.serviceAccount.name }}{{ else }}{{ default "default" .Values.serviceAccount.name }}{{ end -}}
{{- end }}

{{- define "clb-probe.selectorLabels" -}}
app.kubernetes.io/name: clb-probe
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "clb-probe.labels" -}}
{{ include "clb-probe.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}
