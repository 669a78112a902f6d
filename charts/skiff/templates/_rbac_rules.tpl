{{/* The operator's rules are generated from operator/skiff_operator/rbac.py: _rbac_operator.tpl. */}}

{{/* What the router reads to route by model. */}}
{{- define "skiff.routerRules" -}}
- apiGroups: [skiff.dev]
  resources: [inferenceservices]
  verbs: [get, list, watch]
# Scale from zero: a request for a model with no replicas sets its /scale to 1.
- apiGroups: [skiff.dev]
  resources: [inferenceservices/scale]
  verbs: [get, patch]
- apiGroups: [""]
  resources: [services, secrets]
  verbs: [get, list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
{{- end }}
