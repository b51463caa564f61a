{{- define "gpuferry.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpuferry.labels" -}}
app.kubernetes.io/name: {{ include "gpuferry.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpuferry
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "gpuferry.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The labels that select one component's pods. */}}
{{- define "gpuferry.selector" -}}
app.kubernetes.io/name: {{ include "gpuferry.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The code keeps its objects (cluster ID, Leases, tokens) in gpuferry-system. */}}
{{- define "gpuferry.checkNamespace" -}}
{{- if ne .Release.Namespace "gpuferry-system" -}}
{{- fail (printf "install gpuferry into the namespace gpuferry-system (-n gpuferry-system --create-namespace), not %q" .Release.Namespace) -}}
{{- end -}}
{{- end -}}

{{/* A hardened container: non-root, read-only root filesystem, no capabilities. */}}
{{- define "gpuferry.securityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}
