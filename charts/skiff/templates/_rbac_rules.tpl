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
  resources: [services]
  verbs: [get, list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
{{- end }}

{{/* The router's Secrets in a namespace it watches: client keys and internal keys, listed by label. */}}
{{- define "skiff.routerSecretRules" -}}
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, list]
{{- end }}

{{/* Cluster-scoped reads kopf makes to notice namespaces and CRDs appearing. */}}
{{- define "skiff.kopfClusterReads" -}}
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get, list, watch]
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [get, list, watch]
{{- end }}
