{{/*
One controller: its ServiceAccount, Deployment (leader election, probes, hardened), metrics
Service, optional ServiceMonitor, PodDisruptionBudget when replicas > 1, and its Lease Role.
Called with (dict "root" $ "component" "provider" "module" "peering.provider" "values" .Values.provider "args" (list ...)).
*/}}
{{- define "gpuferry.controller" -}}
{{- $root := .root -}}
{{- $name := printf "gpuferry-%s" .component -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuferry.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ $name }}-leases
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuferry.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
rules:
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    verbs: ["get", "list", "watch", "create", "update", "patch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ $name }}-leases
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuferry.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: {{ $name }}-leases}
subjects:
  - {kind: ServiceAccount, name: {{ $name }}, namespace: {{ $root.Release.Namespace }}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ $name }}
  labels:
    {{- include "gpuferry.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {{ $name }}}
subjects:
  - {kind: ServiceAccount, name: {{ $name }}, namespace: {{ $root.Release.Namespace }}}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuferry.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  replicas: {{ .values.replicas }}
  selector:
    matchLabels:
      {{- include "gpuferry.selector" (dict "root" $root "component" .component) | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "gpuferry.selector" (dict "root" $root "component" .component) | nindent 8 }}
    spec:
      serviceAccountName: {{ $name }}
      {{- with $root.Values.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $root.Values.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        runAsNonRoot: true
        fsGroup: 65532
      containers:
        - name: {{ .component }}
          image: {{ include "gpuferry.image" $root }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          command: ["python", "-m", {{ .module | quote }}]
          terminationMessagePolicy: FallbackToLogsOnError   # kubectl describe shows why it stopped
          args:
            - --probe-bind-address=0.0.0.0
            - --probe-port={{ $root.Values.probes.port }}
            - --lease-seconds={{ $root.Values.leaderElection.leaseSeconds }}
            - --renew-seconds={{ $root.Values.leaderElection.renewSeconds }}
            {{- range .args }}
            - {{ . | toJson }}
            {{- end }}
          env:
            - {name: HOME, value: /tmp}
            - {name: PYTHONDONTWRITEBYTECODE, value: "1"}
            - name: POD_IP
              valueFrom: {fieldRef: {fieldPath: status.podIP}}
          ports:
            - {name: probes, containerPort: {{ $root.Values.probes.port }}, protocol: TCP}
          livenessProbe:
            httpGet: {path: /healthz, port: probes}
            periodSeconds: 10
            failureThreshold: 3
          readinessProbe:
            httpGet: {path: /readyz, port: probes}
            periodSeconds: 5
          startupProbe:
            httpGet: {path: /healthz, port: probes}
            periodSeconds: 2
            failureThreshold: 60
          resources:
            {{- toYaml .values.resources | nindent 12 }}
          securityContext:
            {{- include "gpuferry.securityContext" $root | nindent 12 }}
          volumeMounts:
            - {name: tmp, mountPath: /tmp}
      volumes:
        - name: tmp
          emptyDir: {}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ $name }}-metrics
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuferry.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  selector:
    {{- include "gpuferry.selector" (dict "root" $root "component" .component) | nindent 4 }}
  ports:
    - {name: metrics, port: {{ $root.Values.probes.port }}, targetPort: probes, protocol: TCP}
{{- if gt (int .values.replicas) 1 }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuferry.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  minAvailable: 1
  selector:
    matchLabels:
      {{- include "gpuferry.selector" (dict "root" $root "component" .component) | nindent 6 }}
{{- end }}
{{- if $root.Values.serviceMonitor.enabled }}
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpuferry.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  selector:
    matchLabels:
      {{- include "gpuferry.selector" (dict "root" $root "component" .component) | nindent 6 }}
  endpoints:
    - {port: metrics, path: /metrics, interval: {{ $root.Values.serviceMonitor.interval }}}
{{- end }}
{{- end -}}
