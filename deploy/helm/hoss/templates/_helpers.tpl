{{/*
The prefix of every object's name: fullnameOverride, else the release name when it says hoss, else
<release>-hoss. `helm install hoss` names the objects as the kustomize base does.
*/}}
{{- define "hoss.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains "hoss" .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-hoss" .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The labels of a component's objects; call with (dict "root" $ "component" "resolver"). */}}
{{- define "hoss.labels" -}}
app.kubernetes.io/name: {{ include "hoss.fullname" .root }}-{{ .component }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: hoss
{{- end -}}

{{/* registry/repository:tag, without the registry when it is empty. */}}
{{- define "hoss.imageName" -}}
{{- if .registry -}}{{ .registry }}/{{- end -}}{{ .repository }}:{{ .tag }}
{{- end -}}

{{- define "hoss.image" -}}
{{- $image := .Values.image -}}
{{- include "hoss.imageName" (dict "registry" $image.registry "repository" $image.repository "tag" ($image.tag | default .Chart.AppVersion)) -}}
{{- end -}}

{{/* The pod security context of the hoss components (numeric user of the image). */}}
{{- define "hoss.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
{{- if .fsGroup }}
fsGroup: 10001
{{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "hoss.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* nodeSelector and tolerations of every pod. */}}
{{- define "hoss.placement" -}}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
The settings and the Redis URL of a component's container (envFrom and env); call with
(dict "root" $ "user" "hoss-worker" "identity" "HOSS_ID"). Each component's URL carries its own ACL user: from
its key of redis.urlsSecret, or composed from redis.external and its password. "ownPod" true gives it its Pod's
name, namespace and uid (POD_NAME, POD_NAMESPACE, POD_UID), on which it records events about itself (a reload).
*/}}
{{- define "hoss.environment" -}}
{{- $redis := .root.Values.redis -}}
envFrom:
- configMapRef:
    name: {{ include "hoss.fullname" .root }}-config
env:
{{- if $redis.external.host }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ required "redis.external.passwordsSecret: the Secret with each component's Redis password" $redis.external.passwordsSecret }}
      key: {{ .user }}
- name: HOSS_REDIS_URL  # $(REDIS_PASSWORD) is expanded by the kubelet
  value: {{ include "hoss.redisURL" (dict "redis" $redis "user" .user) | quote }}
{{- else }}
- name: HOSS_REDIS_URL  # this component's ACL user (hoss lockdown writes the Secret)
  valueFrom:
    secretKeyRef:
      name: {{ $redis.urlsSecret }}
      key: {{ .user }}
{{- end }}
{{- with .identity }}
- name: {{ . }}
  valueFrom:
    fieldRef:
      apiVersion: v1
      fieldPath: metadata.name
{{- end }}
{{- if .ownPod }}
{{- range $name, $field := dict "POD_NAME" "metadata.name" "POD_NAMESPACE" "metadata.namespace" "POD_UID" "metadata.uid" }}
- name: {{ $name }}
  valueFrom:
    fieldRef:
      apiVersion: v1
      fieldPath: {{ $field }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "hoss.redisURL" -}}
{{- $external := .redis.external -}}
{{- $tls := .redis.tls -}}
{{- printf "%s://%s:$(REDIS_PASSWORD)@%s:%v/%v" (ternary "rediss" "redis" $tls.enabled) .user $external.host $external.port $external.db -}}
{{- if and $tls.enabled $tls.caSecret -}}
?ssl_ca_certs=/etc/hoss/redis-ca/{{ $tls.caKey }}
{{- end -}}
{{- end -}}

{{/* The Redis CA's mount and volume, when redis.tls.caSecret names one. */}}
{{- define "hoss.redisCAMount" -}}
{{- if .Values.redis.tls.caSecret -}}
- name: redis-ca
  mountPath: /etc/hoss/redis-ca
  readOnly: true
{{- end -}}
{{- end -}}

{{- define "hoss.redisCAVolume" -}}
{{- if .Values.redis.tls.caSecret -}}
- name: redis-ca
  secret:
    secretName: {{ .Values.redis.tls.caSecret }}
{{- end -}}
{{- end -}}

{{/* The scratch /tmp of a read-only root filesystem. */}}
{{- define "hoss.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- end -}}

{{/* Preferred anti-affinity: replicas of a component on different nodes when there are several. */}}
{{- define "hoss.spread" -}}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            app.kubernetes.io/name: {{ . }}
{{- end -}}

{{/* The namespaces whose webhook entries ignore failures: the release's own and webhook.systemNamespaces. */}}
{{- define "hoss.systemNamespaces" -}}
{{- toJson (uniq (prepend .Values.webhook.systemNamespaces .Release.Namespace)) -}}
{{- end -}}

{{/* --access=kubernetes: who asks for /status or /metrics (TokenReview), and may they (SubjectAccessReview). */}}
{{- define "hoss.accessReviewRules" }}
- apiGroups: ["authentication.k8s.io"]
  resources: ["tokenreviews"]
  verbs: ["create"]
- apiGroups: ["authorization.k8s.io"]
  resources: ["subjectaccessreviews"]
  verbs: ["create"]
{{- end -}}

{{/*
The shared settings: values.settings, and where this release lives (the components' defaults assume
hoss-system and the ServiceAccount hoss-worker); a key of values.settings wins.
*/}}
{{- define "hoss.settings" -}}
{{- $settings := merge (deepCopy .Values.settings) (dict
  "HOSS_LEASE_NAMESPACE" .Release.Namespace
  "HOSS_ACCESS_NAMESPACE" .Release.Namespace
  "HOSS_HOSS_USERNAMES" (printf "system:serviceaccount:%s:%s-worker" .Release.Namespace (include "hoss.fullname" .))
) -}}
{{- range $key, $value := $settings }}
{{ $key }}: {{ $value | toString | quote }}
{{- end }}
{{- end -}}

{{- define "hoss.policies" -}}
{{- .Values.policies | default (.Files.Get "files/policies.yaml") -}}
{{- end -}}

{{- define "hoss.routing" -}}
{{- .Values.routing | default (.Files.Get "files/routing.yaml") -}}
{{- end -}}

{{/* A worker group's labels: its instance tells the groups apart. */}}
{{- define "hoss.workerLabels" -}}
app.kubernetes.io/name: {{ include "hoss.fullname" .root }}-worker
app.kubernetes.io/instance: {{ .instance }}
app.kubernetes.io/component: worker
app.kubernetes.io/part-of: hoss
{{- end -}}

{{/* What every entry of the resolver's webhook shares; the namespaces In or NotIn the system ones. */}}
{{- define "hoss.webhookEntry" -}}
admissionReviewVersions: ["v1"]
sideEffects: NoneOnDryRun
failurePolicy: {{ .policy }}
timeoutSeconds: {{ .timeout }}
matchPolicy: Equivalent
namespaceSelector:
  matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: {{ .operator }}
    values: {{ .namespaces }}
{{- end -}}

{{/* The lane labels the first binding entry leaves to the others: "1" .. lanes-1. */}}
{{- define "hoss.laneLabels" -}}
{{- $labels := list -}}
{{- range $lane := untilStep 1 (int .) 1 -}}
{{- $labels = append $labels (toString $lane) -}}
{{- end -}}
{{- toJson $labels -}}
{{- end -}}

{{/* Bindings need no matchConditions, so the apiserver evaluates no CEL for them. */}}
{{- define "hoss.bindingRules" -}}
rules:
- apiGroups: [""]
  apiVersions: ["v1"]
  operations: ["CREATE"]
  resources: ["pods/binding", "bindings"]
  scope: "*"
{{- end -}}

{{/*
Pods created with spec.nodeName set and in-place resizes of any pod; the matchConditions leave out every other pod
write and a static pod's mirror posted by its own node.
*/}}
{{- define "hoss.podRules" -}}
rules:
- apiGroups: [""]
  apiVersions: ["v1"]
  operations: ["CREATE"]
  resources: ["pods"]
  scope: "*"
- apiGroups: [""]
  apiVersions: ["v1"]
  operations: ["UPDATE"]
  resources: ["pods/resize"]
  scope: "*"
matchConditions:
- name: on-a-node-or-a-resize
  expression: >-
    request.operation == 'UPDATE' || (has(object.spec) && has(object.spec.nodeName) && object.spec.nodeName != '')
- name: not-a-nodes-own-mirror-pod
  expression: >-
    !(has(object.metadata.annotations) && 'kubernetes.io/config.mirror' in object.metadata.annotations
    && has(object.spec.nodeName) && request.userInfo.username == 'system:node:' + object.spec.nodeName
    && has(request.userInfo.groups) && 'system:nodes' in request.userInfo.groups)
{{- end -}}

{{/* cert-manager's cainjector fills the caBundle of a webhook configuration that carries this annotation. */}}
{{- define "hoss.injectCA" -}}
{{- if eq .Values.certificates.mode "cert-manager" -}}
annotations:
  cert-manager.io/inject-ca-from: {{ .Release.Namespace }}/{{ include "hoss.fullname" . }}-resolver
{{- end -}}
{{- end -}}
