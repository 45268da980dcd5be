// Package faults is shop's fault suite: tests that start real shop processes
// and real lock servers on loopback (and in network namespaces they create),
// inject one fault at a time (a paused holder, a crashed holder, a restarted
// lock server, a Redis failover, a network partition, a cluster's leader
// lost, a Redlock master forgetting a grant), and check what the
// documentation promises: the fenced stores refuse stale writes, the audit
// finds nothing lost, the client-side history of every account is
// linearizable (checked with porcupine), and the service recovers on its
// own.
//
// The package holds only tests; this file exists so that it has a name and
// a doc. `go test ./internal/faults/` runs the short form (every backend
// through a pause and a crash, a Redis restart, the checker's own test,
// a Redlock master forgetting a grant); SHOP_FAULTS=full adds every lock
// server's restart, the Sentinel and Cluster failovers, the partition, and
// the faults of a 3-member etcd cluster and ZooKeeper ensemble (a leader
// killed or cut off, a member killed, the quorum lost).
// Each run prints one table, fault × backend; docs/faults.md explains its
// columns and shows a run.
package faults
