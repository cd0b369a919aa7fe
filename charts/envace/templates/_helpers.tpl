{{/* Chart name, overridable. */}}
{{- define "envace.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Object-name prefix: the release name, plus the chart name unless the release already contains it. */}}
{{- define "envace.fullname" -}}
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

{{- define "envace.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object; "component" is passed as the second list element. */}}
{{- define "envace.labels" -}}
{{- $root := index . 0 -}}
helm.sh/chart: {{ include "envace.chart" $root }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
app.kubernetes.io/part-of: envace
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
{{ include "envace.selectorLabels" . }}
{{- with $root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "envace.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "envace.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "envace.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "envace.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
An image reference `[registry/]repository:tag`. The registry is `global.imageRegistry`, else
`image.registry` (a mirror for every image of the chart), else the image's own `registry`.
Arguments: (list $ image defaultTag), image being a values dict with registry / repository / tag.
*/}}
{{- define "envace.imageRef" -}}
{{- $root := index . 0 -}}
{{- $image := index . 1 -}}
{{- $registry := coalesce (get ($root.Values.global | default dict) "imageRegistry") $root.Values.image.registry $image.registry | default "" -}}
{{- $tag := default (index . 2) $image.tag -}}
{{- if $registry -}}
{{- printf "%s/%s:%s" $registry $image.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" $image.repository $tag -}}
{{- end -}}
{{- end }}

{{- define "envace.image" -}}
{{- include "envace.imageRef" (list . .Values.image .Chart.AppVersion) }}
{{- end }}

{{/* `imagePullSecrets:` of a pod spec on a new line, indented; nothing when there are none. Arguments: (list $ indent). */}}
{{- define "envace.imagePullSecrets" -}}
{{- with (index . 0).Values.imagePullSecrets }}
{{- $secrets := list }}
{{- range . }}{{ $secrets = append $secrets (dict "name" .) }}{{ end }}
{{- dict "imagePullSecrets" $secrets | toYaml | nindent (index $ 1) }}
{{- end }}
{{- end }}

{{/* "true" when pods authenticate to the store with web identity (no static keys), else "". */}}
{{- define "envace.store.webIdentity" -}}
{{- if eq .Values.store.credentials.source "webIdentity" }}true{{ end }}
{{- end }}

{{/*
Volume with the application store credentials as the files `access-key` and `secret-key`
(whatever the Secret's keys are called), for the `mc` containers. Argument: $ ; name `store-credentials`.
*/}}
{{- define "envace.store.credentialsVolume" -}}
- name: store-credentials
  secret:
    secretName: {{ include "envace.store.secretName" . }}
    defaultMode: 0440
    items:
      - key: {{ .Values.store.credentials.accessKeyKey }}
        path: access-key
      - key: {{ .Values.store.credentials.secretKeyKey }}
        path: secret-key
{{- end }}

{{- define "envace.minio.fullname" -}}
{{- printf "%s-minio" (include "envace.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Secret with the application store credentials (pods, KFP launcher). */}}
{{- define "envace.store.secretName" -}}
{{- default (printf "%s-store" (include "envace.fullname" .)) .Values.store.credentials.existingSecret }}
{{- end }}

{{/* Secret with the MinIO root credentials (MinIO, bucket init). */}}
{{- define "envace.minio.rootSecretName" -}}
{{- default (printf "%s-minio-root" (include "envace.fullname" .)) .Values.minio.auth.existingSecret }}
{{- end }}

{{/* host:port of the store, in-cluster. */}}
{{- define "envace.store.endpoint" -}}
{{- if .Values.minio.enabled }}
{{- printf "%s.%s.svc:%v" (include "envace.minio.fullname" .) .Release.Namespace .Values.minio.service.port }}
{{- else }}
{{- required "store.externalEndpoint is required when minio.enabled=false: set it to the host:port of your MinIO / S3 endpoint" .Values.store.externalEndpoint }}
{{- end }}
{{- end }}

{{/*
A Kubernetes quantity, or `fail` naming the values key and an example. values.schema.json checks
only the type (and no negative number): helm reports a schema `pattern` mismatch as the bare regex.
No sign: a negative size or limit is never meant. Arguments: (list key value example).
*/}}
{{- define "envace.quantity" -}}
{{- $key := index . 0 -}}
{{- $value := toString (index . 1) -}}
{{- if not (regexMatch `^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$` $value) -}}
{{- fail (printf "%s=%q is not a Kubernetes quantity: give a number without a sign, optionally with a suffix (m, k, M, G, T, Ki, Mi, Gi, Ti), e.g. --set %s=%s" $key $value $key (index . 2)) -}}
{{- end -}}
{{- $value -}}
{{- end }}

{{/* Container resources as YAML, every quantity checked by envace.quantity. Arguments: (list key resources). */}}
{{- define "envace.resources" -}}
{{- $key := index . 0 -}}
{{- $resources := index . 1 -}}
{{- $examples := dict "cpu" "500m" "memory" "8Gi" "ephemeral-storage" "8Gi" -}}
{{- range $kind, $quantities := $resources -}}
{{- range $name, $value := $quantities -}}
{{- $_ := include "envace.quantity" (list (printf "%s.%s.%s" $key $kind $name) $value (get $examples $name | default "1")) -}}
{{- end -}}
{{- end -}}
{{- toYaml $resources -}}
{{- end }}

{{- define "envace.store.scheme" -}}
{{- ternary "https" "http" .Values.store.secure }}
{{- end }}

{{- define "envace.runtime.storeUri" -}}
{{- default (printf "minio://%s/runs" .Values.store.bucket) .Values.runtime.storeUri }}
{{- end }}

{{/*
ENVACE_S3_* variables: the artifact-store contract of every EnvACE container. The keys are files
of the `store-credentials` volume (`envace.store.credentialsVolume`, mounted at /credentials/store
by `envace.store.credentialsMount`), named by ENVACE_S3_ACCESS_KEY_FILE / ENVACE_S3_SECRET_KEY_FILE.
With web identity there are no keys: the store client takes its credentials from the
ServiceAccount token (AWS_ROLE_ARN / AWS_WEB_IDENTITY_TOKEN_FILE, injected by EKS for the
annotated ServiceAccount).
*/}}
{{- define "envace.store.env" -}}
- name: ENVACE_S3_ENDPOINT
  value: {{ include "envace.store.endpoint" . | quote }}
- name: ENVACE_S3_REGION
  value: {{ .Values.store.region | quote }}
- name: ENVACE_S3_SECURE
  value: {{ .Values.store.secure | quote }}
{{- if not (include "envace.store.webIdentity" .) }}
- name: ENVACE_S3_ACCESS_KEY_FILE
  value: /credentials/store/access-key
- name: ENVACE_S3_SECRET_KEY_FILE
  value: /credentials/store/secret-key
{{- end }}
{{- end }}

{{/* The mount of `envace.store.credentialsVolume` that `envace.store.env` points at. */}}
{{- define "envace.store.credentialsMount" -}}
- name: store-credentials
  mountPath: /credentials/store
  readOnly: true
{{- end }}

{{/*
Reuse a value of a Secret this chart created earlier, so random credentials survive `helm upgrade`;
otherwise generate one. Arguments: (list $ secretName key length).
*/}}
{{- define "envace.secretValue" -}}
{{- $root := index . 0 -}}
{{- $existing := lookup "v1" "Secret" $root.Release.Namespace (index . 1) }}
{{- if and $existing (hasKey (default dict $existing.data) (index . 2)) }}
{{- index $existing.data (index . 2) | b64dec }}
{{- else }}
{{- randAlphaNum (index . 3) }}
{{- end }}
{{- end }}
