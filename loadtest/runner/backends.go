package main

import (
	"slices"

	"github.com/lockbench/shop/internal/lockkit/registry"
)

// referenceRows are the lock-free stock strategies, run beside the
// backends for comparison.
var referenceRows = []string{"atomic-sql", "atomic-redis", "optimistic"}

func crossProcessNames() []string {
	var names []string
	for _, b := range registry.CrossProcess() {
		names = append(names, b.Name)
	}
	return names
}

// lockServers are the servers of the registered backends that are not
// shop's own stores (those the runner sets up itself: the Redis Cluster, a
// database per row), one per setting.
func lockServers() []registry.Server {
	var out []registry.Server
	for _, b := range registry.Backends() {
		srv := b.Server
		if srv.Setting == "" || srv.Store || slices.ContainsFunc(out, func(s registry.Server) bool { return s.Setting == srv.Setting }) {
			continue
		}
		out = append(out, srv)
	}
	return out
}
