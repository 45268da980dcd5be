package memcachedlock

import (
	"testing"
	"time"
)

// Leases round up, never down: a lease memcached cannot express exactly must
// not end on the server before it ends on the client.
func TestWholeSeconds(t *testing.T) {
	for _, tc := range []struct {
		ttl, lease time.Duration
		expiration int32
	}{
		{0, time.Second, 2},
		{300 * time.Millisecond, time.Second, 2},
		{time.Second, time.Second, 2},
		{time.Second + time.Nanosecond, 2 * time.Second, 3},
		{30 * time.Second, 30 * time.Second, 31},
		{365 * 24 * time.Hour, maxLease, 30 * 24 * 3600},
	} {
		lease := wholeSeconds(tc.ttl)
		if lease != tc.lease || expiration(lease) != tc.expiration {
			t.Errorf("ttl %v: lease %v, expiration %d s; want %v, %d s", tc.ttl, lease, expiration(lease), tc.lease, tc.expiration)
		}
	}
}
