{{/* What the operator does in a watched namespace; shared by the Role and the ClusterRole. */}}
{{- define "skiff.operatorRules" -}}
- apiGroups: [skiff.dev]
  resources: [inferenceservices]
  verbs: [get, list, watch, patch, update]
- apiGroups: [skiff.dev]
  resources: [inferenceservices/status, inferenceservices/scale]
  verbs: [get, patch, update]
# Owner references with blockOwnerDeletion need update on the owner's finalizers.
- apiGroups: [skiff.dev]
  resources: [inferenceservices/finalizers]
  verbs: [update]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, update, patch, delete]
# autoscaling.mode=operator reads and sets replicas through the Deployment's /scale.
- apiGroups: [apps]
  resources: [deployments/scale]
  verbs: [get, patch, update]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [keda.sh]
  resources: [scaledobjects]
  verbs: [get, list, watch, create, update, patch, delete]
# Model caches: a claim per InferenceService that asks for one (owned, deleted with it).
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
# Internal API keys (issue 27): one Secret per InferenceService, read and written by name; never listed.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create, patch, delete]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [get, list, watch, patch]
{{- end }}

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
