package events

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestEmbeddedServerDeduplicatesOnMsgID(t *testing.T) {
	srv, err := StartEmbedded(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: Stream, Subjects: []string{Subjects}}); err != nil {
		t.Fatal(err)
	}
	e := Event{ID: ID(1, TypeOrderPaid), Type: TypeOrderPaid}
	for i, wantDup := range []bool{false, true} {
		ack, err := js.Publish(ctx, e.Subject(), []byte("{}"), jetstream.WithMsgID(e.ID))
		if err != nil {
			t.Fatal(err)
		}
		if ack.Duplicate != wantDup {
			t.Fatalf("publish %d: duplicate = %v, want %v", i+1, ack.Duplicate, wantDup)
		}
	}
}
