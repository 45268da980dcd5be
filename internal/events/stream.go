package events

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// StreamOptions are the settings of the stream SHOP_EVENTS that shop
// creates or updates at start (docs/config.md says why each is what it is).
type StreamOptions struct {
	// Name and SubjectPrefix default to Stream and SubjectPrefix; tests
	// sharing a server set their own.
	Name, SubjectPrefix string
	// Replicas is how many servers keep each message: 1 on a lone server,
	// 3 on a 3-node cluster (an acknowledged message survives one node).
	Replicas int
	// DuplicateWindow is how long the stream remembers a Nats-Msg-Id: a
	// republish within it is acknowledged as a duplicate and not stored
	// again. It must cover the relay's longest retry span (RetrySpan).
	DuplicateWindow time.Duration
	// MaxAge is how long a message is kept (limits retention): consumers
	// that were down for less can still catch up.
	MaxAge time.Duration
}

// Defaults of StreamOptions (SHOP_EVENTS_* defaults).
const (
	DefaultReplicas        = 1
	DefaultDuplicateWindow = 10 * time.Minute
	DefaultMaxAge          = 7 * 24 * time.Hour
)

func (o *StreamOptions) defaults() {
	if o.Name == "" {
		o.Name = Stream
	}
	if o.SubjectPrefix == "" {
		o.SubjectPrefix = SubjectPrefix
	}
	if o.Replicas <= 0 {
		o.Replicas = DefaultReplicas
	}
	if o.DuplicateWindow <= 0 {
		o.DuplicateWindow = DefaultDuplicateWindow
	}
	if o.MaxAge <= 0 {
		o.MaxAge = DefaultMaxAge
	}
}

// StreamConfig is the stream as o describes it.
func (o StreamOptions) StreamConfig() jetstream.StreamConfig {
	o.defaults()
	return jetstream.StreamConfig{
		Name:     o.Name,
		Subjects: []string{o.SubjectPrefix + ">"},
		// File storage: an acknowledged event must outlive a broker
		// restart, or the relay's mark would record a publish that is gone.
		Storage: jetstream.FileStorage,
		// Limits retention: the stream is the log every consumer reads at
		// its own pace; interest or work-queue retention would delete an
		// event once one consumer took it.
		Retention:  jetstream.LimitsPolicy,
		MaxAge:     o.MaxAge,
		Discard:    jetstream.DiscardOld,
		Replicas:   o.Replicas,
		Duplicates: o.DuplicateWindow,
	}
}

// EnsureStream creates the stream, or updates it to o's settings.
func EnsureStream(ctx context.Context, js jetstream.JetStream, o StreamOptions) error {
	_, err := js.CreateOrUpdateStream(ctx, o.StreamConfig())
	if err != nil {
		return fmt.Errorf("stream %s: %w", o.StreamConfig().Name, err)
	}
	return nil
}

// BrokerRefused reports whether err is the broker's answer (a JetStream
// API error: the stream's settings are wrong for this broker), as opposed
// to no answer (the broker is down or unreachable). The first stops the
// service at start; the second does not.
func BrokerRefused(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		// 503: JetStream is there but has no leader yet (a cluster
		// electing one, or without quorum): unavailable, not refused.
		return apiErr.Code != http.StatusServiceUnavailable && apiErr.Code != http.StatusRequestTimeout
	}
	return errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) ||
		errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrPermissionViolation)
}
