// Package lockkey declares every class of lock key shop takes, and the one
// way to build a key: "lock:<class>" followed by ":<part>" for each part.
//
// Changing a key is a data migration, not a refactor. Fencing counters
// are per key (a Redis counter beside each key, a MySQL lease row per key),
// and the stores refuse every write whose token does not beat the one the
// row last took. A key spelled differently, even by one byte, starts a new
// counter: where it is not floored by a clock or a cluster-wide revision
// (the mysql backend's lease rows), its tokens start far below the fences
// the rows already carry, and every fenced write of that class is refused
// as stale until the fences are reset (ForgetFences) or the counter passes
// them. lockkey_test pins today's keys byte for byte; docs/operations.md
// points here.
package lockkey

import "strings"

// Class is the kind of a lock key: what it guards. Metrics are labelled by
// class, never by key (one series per account would grow without bound).
type Class string

// The classes of lock key shop takes. Add one here, never spell a key in
// a domain package.
const (
	// Account guards one balance: lock:account:<id>.
	Account Class = "account"
	// Stock guards one product's stock: lock:stock:<sku>.
	Stock Class = "stock"
	// Like guards one entity's likes: lock:like:<type>:<id>.
	Like Class = "like"
	// Order guards one order's status: lock:order:<id>.
	Order Class = "order"
	// OrderCloser is the order closer's leader lease: lock:order-closer.
	OrderCloser Class = "order-closer"
	// EventRelay is the outbox relay's leader lease: lock:event-relay.
	EventRelay Class = "event-relay"
	// IdemPruner is the idempotency record pruner's leader lease:
	// lock:idem-pruner.
	IdemPruner Class = "idem-pruner"
)

// Key is one lock key with its class. The zero Key is no key.
type Key struct {
	class Class
	name  string
}

// Key builds the key of class c naming parts: "lock:<c>:<part>:<part>…".
// Parts must not contain ':' if the key is to stay unambiguous; the
// domains validate what they pass (SKUs, entity types and ids).
func (c Class) Key(parts ...string) Key {
	var b strings.Builder
	b.WriteString("lock:")
	b.WriteString(string(c))
	for _, p := range parts {
		b.WriteByte(':')
		b.WriteString(p)
	}
	return Key{class: c, name: b.String()}
}

// Class is the class k was built from.
func (k Key) Class() Class { return k.class }

// String is the key as lock backends see it.
func (k Key) String() string { return k.name }

// Strings returns the keys as lock backends see them, in the same order.
func Strings(keys []Key) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k.name
	}
	return out
}
