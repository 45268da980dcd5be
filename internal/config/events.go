package config

import (
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/lockbench/shop/internal/events"
	"github.com/lockbench/shop/internal/lockkit"
)

// Event deliveries SHOP_EVENTS_DELIVERY accepts.
const (
	// DeliveryOutbox writes each event in its change's transaction and
	// lets the relay publish it: none is lost.
	DeliveryOutbox = "outbox"
	// DeliveryDirect publishes each event after its change committed (the
	// dual write): a process that dies in between loses it. It exists to
	// show that damage.
	DeliveryDirect = "direct"
)

// Events are the settings of the order events and their broker
// (docs/config.md, docs/events.md).
type Events struct {
	// NATSURL is SHOP_NATS_URL: the NATS servers, comma-separated URLs
	// (nats://host:4222, tls://...). Empty (default) starts an embedded
	// nats-server with JetStream, its store under the run's data dir.
	NATSURL string
	// NATSCreds is SHOP_NATS_CREDS: a NATS credentials file (JWT and
	// nkey seed), for a broker that requires one.
	NATSCreds string
	// Delivery is SHOP_EVENTS_DELIVERY: outbox (default) or direct.
	Delivery string
	// Replicas is SHOP_EVENTS_REPLICAS (default 1): the stream's replicas;
	// 3 on a 3-node cluster.
	Replicas int
	// DuplicateWindow is SHOP_EVENTS_DUPLICATE_WINDOW (default 10m): how
	// long the broker remembers an event id; at least the relay's retry
	// span (RetrySpan).
	DuplicateWindow time.Duration
	// MaxAge is SHOP_EVENTS_MAX_AGE (default 168h): how long the stream
	// keeps an event.
	MaxAge time.Duration
	// RelayInterval is SHOP_EVENTS_RELAY_INTERVAL (default 200ms): how
	// often an idle relay looks at the outbox.
	RelayInterval time.Duration
	// RelayBatch is SHOP_EVENTS_RELAY_BATCH (default 256): the events
	// published before their acks are awaited.
	RelayBatch int
	// RelayMaxBackoff is SHOP_EVENTS_RELAY_MAX_BACKOFF (default 5s): the
	// longest wait between two attempts while the broker fails.
	RelayMaxBackoff time.Duration
}

// EmbeddedNATS reports whether shop starts its own nats-server.
func (e Events) EmbeddedNATS() bool { return e.NATSURL == "" }

// RetrySpan is the longest a published but unmarked event can wait for
// its republish (events.RelayOptions.RetrySpan) with leaderTTL the
// relay's lease.
func (e Events) RetrySpan(leaderTTL time.Duration) time.Duration {
	return events.RelayOptions{PublishTimeout: events.DefaultPublishTimeout, MaxBackoff: e.RelayMaxBackoff,
		LeaderTTL: leaderTTL}.RetrySpan()
}

// events reads the events' settings and checks those that depend on each
// other: the duplicate window against the retry span, replicas against
// an embedded broker, the URLs and the credentials file.
func (p *parser) events(c *Config) {
	e := &c.Events
	e.NATSURL = p.str("SHOP_NATS_URL", "")
	e.NATSCreds = p.str("SHOP_NATS_CREDS", "")
	e.Delivery = p.oneOf("SHOP_EVENTS_DELIVERY", DeliveryOutbox, []string{DeliveryOutbox, DeliveryDirect})
	e.Replicas = int(p.int("SHOP_EVENTS_REPLICAS", events.DefaultReplicas, 1))
	e.DuplicateWindow = p.positiveDuration("SHOP_EVENTS_DUPLICATE_WINDOW", events.DefaultDuplicateWindow)
	e.MaxAge = p.positiveDuration("SHOP_EVENTS_MAX_AGE", events.DefaultMaxAge)
	e.RelayInterval = p.positiveDuration("SHOP_EVENTS_RELAY_INTERVAL", events.DefaultRelayInterval)
	e.RelayBatch = int(p.int("SHOP_EVENTS_RELAY_BATCH", events.DefaultRelayBatch, 1))
	e.RelayMaxBackoff = p.positiveDuration("SHOP_EVENTS_RELAY_MAX_BACKOFF", events.DefaultRelayMaxBackoff)

	for _, u := range strings.Split(e.NATSURL, ",") {
		if e.NATSURL == "" {
			break
		}
		parsed, err := url.Parse(strings.TrimSpace(u))
		if err != nil || parsed.Host == "" || !slices.Contains([]string{"nats", "tls", "ws", "wss"}, parsed.Scheme) {
			p.fail("SHOP_NATS_URL", "has %q; want nats://host:port (or tls://, ws://, wss://), comma-separated", u)
		}
	}
	if e.NATSCreds != "" {
		if _, err := os.Stat(e.NATSCreds); err != nil {
			p.fail("SHOP_NATS_CREDS", "cannot be read: %v", err)
		}
	}
	if e.EmbeddedNATS() && e.Replicas > 1 {
		p.fail("SHOP_EVENTS_REPLICAS", "is %d, but the embedded nats-server (SHOP_NATS_URL unset) is one server", e.Replicas)
	}
	ttl := c.LockTTL
	if ttl <= 0 {
		ttl = lockkit.DefaultLeaseTTL
	}
	if span := e.RetrySpan(ttl); e.DuplicateWindow < span {
		p.fail("SHOP_EVENTS_DUPLICATE_WINDOW", "is %s, under the relay's retry span %s (publish timeout %s + SHOP_EVENTS_RELAY_MAX_BACKOFF + the relay's lease): a republish after a relay died could be stored twice",
			e.DuplicateWindow, span, events.DefaultPublishTimeout)
	}
}

// eventAttrs are the settings events reads.
func (c Config) eventAttrs() []slog.Attr {
	e := c.Events
	return []slog.Attr{
		slog.String("nats_url", orDefault(maskURL(e.NATSURL), "(embedded)")),
		slog.String("nats_creds", e.NATSCreds),
		slog.String("events_delivery", e.Delivery),
		slog.Int("events_replicas", e.Replicas),
		slog.Duration("events_duplicate_window", e.DuplicateWindow),
		slog.Duration("events_max_age", e.MaxAge),
		slog.Duration("events_relay_interval", e.RelayInterval),
		slog.Int("events_relay_batch", e.RelayBatch),
		slog.Duration("events_relay_max_backoff", e.RelayMaxBackoff),
	}
}

// maskURL hides the password of nats://user:password@host URLs.
func maskURL(urls string) string {
	parts := strings.Split(urls, ",")
	for i, u := range parts {
		if parsed, err := url.Parse(strings.TrimSpace(u)); err == nil && parsed.User != nil {
			if _, has := parsed.User.Password(); has {
				parsed.User = url.UserPassword(parsed.User.Username(), "********")
				parts[i] = parsed.Redacted()
			}
		}
	}
	return strings.Join(parts, ",")
}
