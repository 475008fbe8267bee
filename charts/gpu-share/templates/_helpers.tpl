{{/* Chart name, overridable. */}}
{{- define "gpu-share.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 30 | trimSuffix "-" -}}
{{- end -}}

{{/* "<release>-<chart>" (or the release name alone when it already holds the chart name).
Kept to 38 characters so "<fullname>-<pool>-mps" stays a valid 63-character name. */}}
{{- define "gpu-share.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 38 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "gpu-share.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 38 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 38 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpu-share.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Label key naming the node pool of an object. */}}
{{- define "gpu-share.poolLabel" -}}gpu-share.vendor.com/pool{{- end -}}

{{- define "gpu-share.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-share.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpu-share.labels" -}}
helm.sh/chart: {{ include "gpu-share.chart" . }}
{{ include "gpu-share.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpu-share
{{- end -}}

{{- define "gpu-share.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gpu-share.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Image reference from a {registry, repository, tag, digest} map; the digest wins.
Call with (dict "image" $img "root" $). */}}
{{- define "gpu-share.imageRef" -}}
{{- $img := .image -}}
{{- $repo := $img.repository -}}
{{- if $img.registry -}}
{{- $repo = printf "%s/%s" $img.registry $img.repository -}}
{{- end -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $repo $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .root.Chart.AppVersion $img.tag) -}}
{{- end -}}
{{- end -}}

{{- define "gpu-share.image" -}}
{{- include "gpu-share.imageRef" (dict "image" .Values.image "root" .) -}}
{{- end -}}

{{/* MPS control daemon image: its own fields where set, else the agent image. */}}
{{- define "gpu-share.mpsImage" -}}
{{- $own := .Values.mpsControlDaemon.image -}}
{{- if $own.repository -}}
{{- include "gpu-share.imageRef" (dict "image" $own "root" .) -}}
{{- else -}}
{{- include "gpu-share.image" . -}}
{{- end -}}
{{- end -}}

{{/* Deep merge of two maps given as (list base override), returned as JSON. Maps merge
recursively; any other override value (list, scalar, false, 0, "") replaces the base one;
null means "not set". Unlike sprig's mergeOverwrite, false and 0 do override. */}}
{{- define "gpu-share.deepMerge" -}}
{{- $out := deepCopy (index . 0) -}}
{{- range $key, $over := (index . 1) -}}
{{- if kindIs "invalid" $over -}}
{{- /* null: keep the base value */ -}}
{{- else if and (kindIs "map" $over) (kindIs "map" (get $out $key)) -}}
{{- $_ := set $out $key (include "gpu-share.deepMerge" (list (get $out $key) $over) | fromJson) -}}
{{- else -}}
{{- $_ := set $out $key $over -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* Pod-level settings of one pool (poolDefaults merged with the entry), as JSON.
Call with (dict "root" $ "pool" $pool). */}}
{{- define "gpu-share.poolSettings" -}}
{{- $entry := omit .pool "agentConfig" -}}
{{- include "gpu-share.deepMerge" (list .root.Values.poolDefaults $entry) -}}
{{- end -}}

{{/* The agent config (AgentConfig v1) of one pool, as JSON: agentConfig merged with the
pool's overrides, plus what the chart owns (version, host paths). */}}
{{- define "gpu-share.poolConfig" -}}
{{- $root := .root -}}
{{- $cfg := include "gpu-share.deepMerge" (list $root.Values.agentConfig (.pool.agentConfig | default dict)) | fromJson -}}
{{- $paths := $root.Values.hostPaths -}}
{{- $_ := set $cfg "version" "v1" -}}
{{- $kubelet := $cfg.kubelet | default dict -}}
{{- $_ = set $kubelet "devicePluginDir" $paths.devicePluginDir -}}
{{- $_ = set $kubelet "podResourcesSocket" (printf "%s/kubelet.sock" $paths.podResourcesDir) -}}
{{- $_ = set $cfg "kubelet" $kubelet -}}
{{- $_ = set $cfg "stateDir" $paths.stateDir -}}
{{- $dummy := $cfg.dummy | default dict -}}
{{- if not $dummy.faultFile -}}
{{- $_ = set $dummy "faultFile" (printf "%s/dummy-faults.json" $paths.stateDir) -}}
{{- end -}}
{{- $_ = set $cfg "dummy" $dummy -}}
{{- /* DRA: the kubelet plugin dirs (mounted at the same paths) and the CDI dir as the
agent sees it (the cdi-dynamic mount). */ -}}
{{- $dra := $cfg.dra | default dict -}}
{{- $_ = set $dra "pluginDir" (printf "%s/%s" $paths.kubeletPluginsDir $dra.driverName) -}}
{{- $_ = set $dra "registrationDir" $paths.kubeletPluginsRegistryDir -}}
{{- $_ = set $dra "cdiDir" "/var/run/cdi" -}}
{{- $_ = set $cfg "dra" $dra -}}
{{- /* The toolkit's hook as the agent sees it (the daemonset mounts its host dir). */ -}}
{{- $rt := $cfg.runtime | default dict -}}
{{- $nml := $rt.nvidiaMemoryLimits | default dict -}}
{{- $_ = set $nml "checkPath" (printf "/run/gpu-share/nvidia-cdi-hook/%s" (base ($nml.hookPath | default "/usr/bin/nvidia-cdi-hook"))) -}}
{{- $_ = set $rt "nvidiaMemoryLimits" $nml -}}
{{- $_ = set $cfg "runtime" $rt -}}
{{- if $root.Values.scheduler.enabled -}}
{{- $placement := $cfg.placement | default dict -}}
{{- if not $placement.decisionKeyFile -}}
{{- $_ = set $placement "decisionKeyFile" (printf "%s/key" $root.Values.scheduler.decisionKey.mountPath) -}}
{{- end -}}
{{- $_ = set $cfg "placement" $placement -}}
{{- end -}}
{{- toJson $cfg -}}
{{- end -}}

{{/* Name prefix of one pool's objects. */}}
{{- define "gpu-share.poolFullname" -}}
{{- printf "%s-%s" (include "gpu-share.fullname" .root) .pool.name -}}
{{- end -}}

{{/* Selector labels of one pool's agent pods. */}}
{{- define "gpu-share.poolSelectorLabels" -}}
{{ include "gpu-share.selectorLabels" .root }}
app.kubernetes.io/component: agent
{{ include "gpu-share.poolLabel" . }}: {{ .pool.name }}
{{- end -}}

{{/* Whether this release renders the ValidatingAdmissionPolicies ("true" or ""): asked
for and Kubernetes >= 1.30 (admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy is GA
there). Not gated on .Capabilities.APIVersions: offline renders (helm template) never list
the kind, which used to drop the policies silently; a 1.30+ cluster with the API turned off
makes the install fail on the unknown kind instead (fail closed). */}}
{{- define "gpu-share.admissionPolicyEnabled" -}}
{{- if and .Values.admissionPolicy.enabled (semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version) -}}
true
{{- end -}}
{{- end -}}

{{/* Fails rendering when the policies are asked for on a cluster that cannot run them,
unless admissionPolicy.allowUnprotected says to install without them. */}}
{{- define "gpu-share.admissionPolicyCheck" -}}
{{- if and .Values.admissionPolicy.enabled (not (include "gpu-share.admissionPolicyEnabled" .)) (not .Values.admissionPolicy.allowUnprotected) -}}
{{- fail (printf "admissionPolicy: Kubernetes %s has no ValidatingAdmissionPolicy v1 (needs 1.30+). Without it tenants can set env that lifts their GPU limits and forge gpu-share annotations. Upgrade the cluster, or set admissionPolicy.allowUnprotected=true to install unprotected" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- end -}}

{{/* "sidecar" or "service". */}}
{{- define "gpu-share.extenderMode" -}}
{{- .Values.scheduler.extender.mode | default "sidecar" -}}
{{- end -}}

{{/* "true" when the extender's API takes mutual TLS only: service mode, and sidecar mode
in the host network (its 127.0.0.1 is then the node's, reachable by every process and
host-network pod there). */}}
{{- define "gpu-share.extenderTLS" -}}
{{- if or (eq (include "gpu-share.extenderMode" .) "service") .Values.scheduler.hostNetwork -}}
true
{{- end -}}
{{- end -}}

{{/* The name the extender's server certificate carries (the Service's, also in sidecar
mode, where the scheduler reaches it on 127.0.0.1 and checks this name). */}}
{{- define "gpu-share.extenderServerName" -}}
{{- printf "%s-extender.%s.svc" (include "gpu-share.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/* ServiceAccount the extender runs as: the scheduler pod's in sidecar mode. */}}
{{- define "gpu-share.extenderServiceAccount" -}}
{{- $fn := include "gpu-share.fullname" . -}}
{{- if eq (include "gpu-share.extenderMode" .) "sidecar" -}}
{{- printf "%s-scheduler" $fn -}}
{{- else -}}
{{- printf "%s-extender" $fn -}}
{{- end -}}
{{- end -}}

{{/* Usernames that may write gpu-share.<domain>/* annotations, as a JSON list: the
agent's ServiceAccount, the extender's (when the scheduler is enabled), and the extras. */}}
{{- define "gpu-share.annotationWriters" -}}
{{- $users := list (printf "system:serviceaccount:%s:%s" .Release.Namespace (include "gpu-share.serviceAccountName" .)) -}}
{{- if .Values.scheduler.enabled -}}
{{- $users = append $users (printf "system:serviceaccount:%s:%s" .Release.Namespace (include "gpu-share.extenderServiceAccount" .)) -}}
{{- end -}}
{{- range .Values.admissionPolicy.extraAnnotationWriters -}}
{{- $users = append $users . -}}
{{- end -}}
{{- toJson (uniq $users) -}}
{{- end -}}

{{/* What the pools' configs name, as JSON: annotation prefixes ("gpu-share.<domain>/"),
the keys under them that pod authors write (tenantKeys: the GPU models a pod accepts,
sharing/placement/pod_models.py models_key), memory and core resource names, and whether any pool
enforces limits (mps, hami-core, nvidia-memory-limits). */}}
{{- define "gpu-share.poolResources" -}}
{{- $root := . -}}
{{- $prefixes := list -}}
{{- $tenantKeys := list -}}
{{- $mem := list -}}
{{- $core := list -}}
{{- $enforcing := false -}}
{{- range $pool := .Values.nodePools -}}
{{- $cfg := include "gpu-share.poolConfig" (dict "root" $root "pool" $pool) | fromJson -}}
{{- $r := $cfg.resources -}}
{{- $prefixes = append $prefixes (printf "gpu-share.%s/" $r.domain) -}}
{{- $tenantKeys = append $tenantKeys (printf "gpu-share.%s/models" $r.domain) -}}
{{- $mem = append $mem (printf "%s/%s" $r.domain $r.memoryName) -}}
{{- $core = append $core (printf "%s/%s" $r.domain $r.coreName) -}}
{{- if has $cfg.runtime.enforcement (list "mps" "hami-core" "nvidia-memory-limits" "auto") -}}
{{- $enforcing = true -}}
{{- end -}}
{{- end -}}
{{- toJson (dict "prefixes" (uniq $prefixes) "tenantKeys" (uniq $tenantKeys) "memory" (uniq $mem) "cores" (uniq $core) "enforcing" $enforcing) -}}
{{- end -}}

{{/* Driver names of the pools in DRA mode (agentConfig.dra.enabled), as a JSON list
(empty: no DRA pool, nothing DRA is rendered). */}}
{{- define "gpu-share.draDrivers" -}}
{{- $root := . -}}
{{- $drivers := list -}}
{{- range $pool := .Values.nodePools -}}
{{- $cfg := include "gpu-share.poolConfig" (dict "root" $root "pool" $pool) | fromJson -}}
{{- if $cfg.dra.enabled -}}
{{- $drivers = append $drivers $cfg.dra.driverName -}}
{{- end -}}
{{- end -}}
{{- toJson (uniq $drivers) -}}
{{- end -}}

{{/* Value checks the schema cannot express; fails rendering with a message naming the
pool(s). Included once, from daemonset.yaml. */}}
{{- define "gpu-share.validate" -}}
{{- $root := . -}}
{{- $seen := dict -}}
{{- range $pool := .Values.nodePools -}}
{{- if hasKey $seen $pool.name -}}
{{- fail (printf "nodePools: duplicate pool name %q; every pool needs a unique name" $pool.name) -}}
{{- end -}}
{{- $_ := set $seen $pool.name true -}}
{{- end -}}
{{- range $i, $a := .Values.nodePools -}}
{{- range $j, $b := $root.Values.nodePools -}}
{{- if lt $i $j -}}
{{- if eq (toJson $a.nodeSelector) (toJson $b.nodeSelector) -}}
{{- fail (printf "nodePools %q and %q have identical nodeSelectors %s: pools must not overlap on a node; give each pool a label value of its own" $a.name $b.name (toJson $a.nodeSelector)) -}}
{{- end -}}
{{- end -}}
{{- if ne $i $j -}}
{{- /* $a's selector inside $b's: every node of $b also matches $a. */ -}}
{{- $contained := true -}}
{{- range $k, $v := $a.nodeSelector -}}
{{- if not (and (hasKey $b.nodeSelector $k) (eq (get $b.nodeSelector $k) $v)) -}}
{{- $contained = false -}}
{{- end -}}
{{- end -}}
{{- $aSettings := include "gpu-share.poolSettings" (dict "root" $root "pool" $a) | fromJson -}}
{{- if and $contained (not $aSettings.affinity) (ne (toJson $a.nodeSelector) (toJson $b.nodeSelector)) -}}
{{- fail (printf "nodePools %q and %q overlap: every node matching %q's nodeSelector %s also matches %q's %s; add a label that tells them apart" $a.name $b.name $b.name (toJson $b.nodeSelector) $a.name (toJson $a.nodeSelector)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (include "gpu-share.draDrivers" . | fromJsonArray) (semverCompare "<1.34.0-0" .Capabilities.KubeVersion.Version) -}}
{{- fail (printf "agentConfig.dra.enabled: DRA mode needs Kubernetes 1.34+ (resource.k8s.io/v1), this is %s" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- range $pool := .Values.nodePools -}}
{{- $cfg := include "gpu-share.poolConfig" (dict "root" $root "pool" $pool) | fromJson -}}
{{- if not (hasPrefix (printf "%s/" $root.Values.hostPaths.stateDir) $cfg.dummy.faultFile) -}}
{{- fail (printf "nodePools %q: agentConfig.dummy.faultFile %q must lie inside hostPaths.stateDir %q (the only host dir mounted for it)" $pool.name $cfg.dummy.faultFile $root.Values.hostPaths.stateDir) -}}
{{- end -}}
{{- $strategies := $cfg.runtime.deviceListStrategy | default list -}}
{{- if and (eq $cfg.runtime.enforcement "nvidia-memory-limits") (not $cfg.dra.enabled) (not (or (has "cdi-cri" $strategies) (has "cdi-annotations" $strategies))) -}}
{{- fail (printf "nodePools %q: agentConfig.runtime.enforcement nvidia-memory-limits needs cdi-annotations or cdi-cri in agentConfig.runtime.deviceListStrategy (the toolkit's hook reaches a container only as a CDI device)" $pool.name) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The config file of one pool, as YAML (also the input of the checksum annotation). */}}
{{- define "gpu-share.configYaml" -}}
# gpu-share agent config (AgentConfig v1) of node pool {{ .pool.name }}; rendered by the chart.
{{ include "gpu-share.poolConfig" . | fromJson | toYaml }}
{{- end -}}

{{/* Name of the decision key's Secret: the user's (existingSecret) or the chart's. */}}
{{- define "gpu-share.decisionKeySecret" -}}
{{- default (printf "%s-decision-key" (include "gpu-share.fullname" .)) .Values.scheduler.decisionKey.existingSecret -}}
{{- end -}}

{{/* The decision key's Secret as stored in the cluster, as JSON ({} under `helm template`,
or before the first install). */}}
{{- define "gpu-share.decisionKeyStored" -}}
{{- lookup "v1" "Secret" .Release.Namespace (include "gpu-share.decisionKeySecret" .) | default dict | toJson -}}
{{- end -}}

{{/* The decision key as its Secret holds it (base64): the stored key while there is one
(kept across upgrades); else, for the chart's own Secret, a new random key (delete the
Secret and upgrade to rotate); else "" (the user's Secret, not readable here). Made once per
render and remembered, so the Secret and the checksum/decision-key of every pod that reads
the key agree, whichever template renders first. */}}
{{- define "gpu-share.decisionKey" -}}
{{- $memo := .Values.scheduler.decisionKey -}}
{{- if not (hasKey $memo "_rendered") -}}
{{- $stored := include "gpu-share.decisionKeyStored" . | fromJson -}}
{{- $key := index ($stored.data | default dict) "key" | default "" -}}
{{- if and (not $key) (not $memo.existingSecret) -}}
{{- $key = randAlphaNum 48 | b64enc -}}
{{- end -}}
{{- $_ := set $memo "_rendered" $key -}}
{{- end -}}
{{- get $memo "_rendered" -}}
{{- end -}}

{{/* The extender container; (dict "root" $ "mode" "sidecar"|"service"). Sidecar: plain
HTTP on the pod's loopback, probed by exec (the kubelet cannot reach a pod's loopback).
Service: HTTPS requiring a client certificate of the CA in ca.crt; probed by TCP connect
(an HTTP probe would need the client certificate). */}}
{{- define "gpu-share.extenderContainer" -}}
{{- $root := .root -}}
{{- $ext := $root.Values.scheduler.extender -}}
{{- $res := $root.Values.agentConfig.resources -}}
{{- $sidecar := eq .mode "sidecar" -}}
{{- $tls := include "gpu-share.extenderTLS" $root -}}
{{- $scheme := ternary "https" "http" (eq $tls "true") -}}
{{- /* Probes of a mutual-TLS API present the scheduler's client certificate. */}}
{{- $probeTLS := list "--cert" "/etc/gpu-share-extender-client/tls.crt" "--key" "/etc/gpu-share-extender-client/tls.key" "--ca" "/etc/gpu-share-extender-client/ca.crt" "--server-name" (include "gpu-share.extenderServerName" $root) -}}
- name: extender
  image: {{ include "gpu-share.image" $root }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  command: ["gpu-share-extender"]
  args:
    {{- if $sidecar }}
    - --listen=127.0.0.1:{{ $ext.port }}
    {{- else }}
    - --listen=0.0.0.0:{{ $ext.port }}
    {{- end }}
    {{- if $tls }}
    - --tls-cert-file=/etc/gpu-share-extender-tls/tls.crt
    - --tls-key-file=/etc/gpu-share-extender-tls/tls.key
    - --client-ca-file=/etc/gpu-share-extender-tls/ca.crt
    {{- end }}
    - --domain={{ $res.domain }}
    - --memory-name={{ $res.memoryName }}
    - --core-name={{ $res.coreName }}
    - --key-file={{ $root.Values.scheduler.decisionKey.mountPath }}/key
    - --policy={{ $ext.policy }}
    - --default-workload={{ $ext.defaultWorkload }}
    - --model-label={{ $ext.modelLabel }}
    {{- if $root.Values.webhook.enabled }}
    # DRA pods: the driver whose claim results are our devices (read at bind).
    - --dra-driver={{ (include "gpu-share.webhookSettings" $root | fromJson).driver }}
    {{- end }}
    - --max-body-bytes={{ int $ext.maxBodyBytes }}
    - --read-timeout-seconds={{ $ext.readTimeoutSeconds }}
    - --idle-timeout-seconds={{ $ext.idleTimeoutSeconds }}
    - --workers={{ $ext.workers }}
    {{- if $ext.metrics.port }}
    - --metrics-port={{ int $ext.metrics.port }}
    - --metrics-bind={{ $ext.metrics.bindAddress | default "$(POD_IP)" }}
    {{- end }}
  env:
    # The pod's own address: the metrics listener binds it unless metrics.bindAddress says
    # otherwise (in the host network, the node's address, not every interface).
    - name: POD_IP
      valueFrom:
        fieldRef:
          fieldPath: status.podIP
  {{- with (and $sidecar $root.Values.scheduler.extraEnv) }}
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if $sidecar }}
  {{- if $ext.metrics.port }}
  ports:
    - name: metrics
      containerPort: {{ int $ext.metrics.port }}
  {{- end }}
  readinessProbe:
    exec:
      command: {{ concat (list "gpu-share" "probe" "--timeout" "3") (ternary $probeTLS (list) (eq $tls "true")) (list (printf "%s://127.0.0.1:%v/readyz" $scheme $ext.port)) | toJson }}
    periodSeconds: 10
    timeoutSeconds: 5
  livenessProbe:
    exec:
      command: {{ concat (list "gpu-share" "probe" "--timeout" "3") (ternary $probeTLS (list) (eq $tls "true")) (list (printf "%s://127.0.0.1:%v/healthz" $scheme $ext.port)) | toJson }}
    initialDelaySeconds: 10
    periodSeconds: 20
    timeoutSeconds: 5
  {{- else }}
  ports:
    - name: https
      containerPort: {{ $ext.port }}
    {{- if $ext.metrics.port }}
    - name: metrics
      containerPort: {{ int $ext.metrics.port }}
    {{- end }}
  readinessProbe:
    tcpSocket:
      port: https
    periodSeconds: 10
  livenessProbe:
    tcpSocket:
      port: https
    initialDelaySeconds: 10
    periodSeconds: 20
  {{- end }}
  resources:
    {{- toYaml $ext.resources | nindent 4 }}
  securityContext:
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: ["ALL"]
  volumeMounts:
    - name: decision-key
      mountPath: {{ $root.Values.scheduler.decisionKey.mountPath }}
      readOnly: true
    {{- if $tls }}
    - name: extender-tls
      mountPath: /etc/gpu-share-extender-tls
      readOnly: true
    {{- end }}
    {{- if and $sidecar $tls }}
    - name: extender-client-tls
      mountPath: /etc/gpu-share-extender-client
      readOnly: true
    {{- end }}
{{- end -}}
