package events

import (
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Embedded is a nats-server running inside this process, JetStream on,
// for `make run`: the service then needs nothing but Go. A deployment
// points SHOP_NATS_URL at real servers instead.
type Embedded struct{ srv *server.Server }

// StartEmbedded starts a nats-server on a free loopback port with its
// JetStream file store under dir, and waits until it accepts clients.
func StartEmbedded(dir string) (*Embedded, error) {
	srv, err := server.NewServer(&server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		JetStream: true,
		StoreDir:  dir,
		NoSigs:    true,
	})
	if err != nil {
		return nil, fmt.Errorf("embedded nats-server: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("embedded nats-server: not ready after 10s")
	}
	return &Embedded{srv: srv}, nil
}

// URL is the address clients connect to.
func (e *Embedded) URL() string { return e.srv.ClientURL() }

// Close stops the server and waits until it has.
func (e *Embedded) Close() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}
