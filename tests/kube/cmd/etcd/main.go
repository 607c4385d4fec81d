// etcd, built from go.etcd.io/etcd/server/v3 at the version go.mod pins, for the tests' control plane.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
