//go:build tools

// Package tools pins the one Kubernetes main package built from this module by
// hack/cluster/build.sh k8s-136 so that `go mod tidy` keeps its dependencies.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
