// Command etcd starts the etcd server through its public entry point,
// go.etcd.io/etcd/server/v3/etcdmain (the same call etcd's own main makes).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
