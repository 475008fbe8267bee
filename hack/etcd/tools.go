//go:build tools

// Package main (tools build tag only) keeps etcdctl's dependencies in go.sum.
package main

import (
	_ "go.etcd.io/etcd/etcdctl/v3"
)
