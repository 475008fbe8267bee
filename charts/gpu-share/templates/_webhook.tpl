{{/* Helpers of the DRA admission webhook (webhook.*, docs/dra.md). */}}

{{/* What the webhook must agree on with the DRA pools' agents, as JSON: driver (the
DeviceClass its claims name), memoryUnitMiB, domain, memoryName, coreName and the two full
resource names. Fails when no pool runs in DRA mode, or the DRA pools disagree (one webhook
translates for all of them). */}}
{{- define "gpu-share.webhookSettings" -}}
{{- $root := . -}}
{{- $seen := list -}}
{{- range $pool := .Values.nodePools -}}
{{- $cfg := include "gpu-share.poolConfig" (dict "root" $root "pool" $pool) | fromJson -}}
{{- if $cfg.dra.enabled -}}
{{- $r := $cfg.resources -}}
{{- $seen = append $seen (dict "driver" $cfg.dra.driverName "memoryUnitMiB" (int $cfg.memoryUnitMiB) "domain" $r.domain "memoryName" $r.memoryName "coreName" $r.coreName) -}}
{{- end -}}
{{- end -}}
{{- if not $seen -}}
{{- fail "webhook.enabled: the DRA admission webhook needs a node pool with agentConfig.dra.enabled=true (it turns vcuda limits into claims for a DRA driver); enable DRA on a pool or set webhook.enabled=false" -}}
{{- end -}}
{{- $first := first $seen -}}
{{- range $s := $seen -}}
{{- if ne (toJson $s) (toJson $first) -}}
{{- fail (printf "webhook.enabled: the DRA pools differ in driverName, memoryUnitMiB or resource names (%s vs %s); one webhook translates for all of them, so they must agree" (toJson $first) (toJson $s)) -}}
{{- end -}}
{{- end -}}
{{- $out := deepCopy $first -}}
{{- $_ := set $out "memory" (printf "%s/%s" $first.domain $first.memoryName) -}}
{{- $_ = set $out "cores" (printf "%s/%s" $first.domain $first.coreName) -}}
{{- toJson $out -}}
{{- end -}}

{{- define "gpu-share.webhookName" -}}
{{- printf "%s-webhook" (include "gpu-share.fullname" .) -}}
{{- end -}}

{{- define "gpu-share.webhookSelectorLabels" -}}
{{ include "gpu-share.selectorLabels" . }}
app.kubernetes.io/component: webhook
{{- end -}}

{{/* The serving certificate's names, as JSON {"dns": [...], "ips": [...]}: the Service's
DNS names, plus the host of webhook.url when set. */}}
{{- define "gpu-share.webhookCertNames" -}}
{{- $svc := include "gpu-share.webhookName" . -}}
{{- $ns := .Release.Namespace -}}
{{- $dns := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) -}}
{{- $ips := list -}}
{{- with .Values.webhook.url -}}
{{- $host := (urlParse .).hostname -}}
{{- if regexMatch "^[0-9.]+$|:" $host -}}
{{- $ips = append $ips $host -}}
{{- else -}}
{{- $dns = append $dns $host -}}
{{- end -}}
{{- end -}}
{{- toJson (dict "dns" $dns "ips" $ips) -}}
{{- end -}}

{{/* The webhook's TLS Secret data, as JSON {"data": {tls.crt, tls.key, ca.crt}
(base64), "names": <the certificate's names>, "reused": bool}. Call with (dict "root" $
"old" <the Secret as `lookup` returns it, or an empty dict>). The old Secret is kept when it
has all three keys and was made for the same names, so upgrades do not rotate the
certificate (nor the caBundle); otherwise a new CA and serving certificate are generated. */}}
{{- define "gpu-share.webhookTLS" -}}
{{- $root := .root -}}
{{- $old := .old | default dict -}}
{{- $names := include "gpu-share.webhookCertNames" $root -}}
{{- $oldData := $old.data | default dict -}}
{{- $oldNames := "" -}}
{{- with $old.metadata -}}
{{- $oldNames = get (.annotations | default dict) "gpu-share.vendor.com/certificate-names" -}}
{{- end -}}
{{- $reuse := eq $oldNames $names -}}
{{- range $k := list "tls.crt" "tls.key" "ca.crt" -}}
{{- if not (get $oldData $k) -}}
{{- $reuse = false -}}
{{- end -}}
{{- end -}}
{{- $data := dict -}}
{{- if $reuse -}}
{{- $data = dict "tls.crt" (get $oldData "tls.crt") "tls.key" (get $oldData "tls.key") "ca.crt" (get $oldData "ca.crt") -}}
{{- else -}}
{{- $n := $names | fromJson -}}
{{- $days := int $root.Values.webhook.tls.validityDays -}}
{{- $svc := include "gpu-share.webhookName" $root -}}
{{- $ca := genCA (printf "%s-ca" $svc) $days -}}
{{- $cert := genSignedCert (printf "%s.%s.svc" $svc $root.Release.Namespace) $n.ips $n.dns $days $ca -}}
{{- $data = dict "tls.crt" ($cert.Cert | b64enc) "tls.key" ($cert.Key | b64enc) "ca.crt" ($ca.Cert | b64enc) -}}
{{- end -}}
{{- toJson (dict "data" $data "names" $names "reused" $reuse) -}}
{{- end -}}

{{/* CEL of the webhook's matchCondition: true when a container or init container names
one of the vcuda resources in its limits or requests. Call with the settings JSON map. */}}
{{- define "gpu-share.webhookMatchExpression" -}}
{{- $names := printf "[%q, %q]" .memory .cores -}}
{{- $asks := printf "has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(k, k in %s)) || (has(c.resources.requests) && c.resources.requests.exists(k, k in %s)))" $names $names -}}
{{- printf "object.spec.containers.exists(c, %s) || (has(object.spec.initContainers) && object.spec.initContainers.exists(c, %s))" $asks $asks -}}
{{- end -}}
