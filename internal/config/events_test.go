package config

import (
	"strings"
	"testing"
	"time"
)

func TestEventsDefaultsNeedOnlyGo(t *testing.T) {
	c, err := Load(env(map[string]string{"SHOP_ENV": "dev"}))
	if err != nil {
		t.Fatal(err)
	}
	e := c.Events
	if !e.EmbeddedNATS() || e.Delivery != DeliveryOutbox || e.Replicas != 1 || e.DuplicateWindow != 10*time.Minute ||
		e.DuplicateWindow < e.RetrySpan(30*time.Second) {
		t.Fatalf("event defaults: %+v", e)
	}
}

func TestEventsSettingsAreChecked(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string // in the error; "" for none
	}{
		{"cluster", map[string]string{"SHOP_NATS_URL": "nats://a:4222,nats://b:4222,tls://c:4222", "SHOP_EVENTS_REPLICAS": "3"}, ""},
		{"direct", map[string]string{"SHOP_EVENTS_DELIVERY": "direct"}, ""},
		{"unknown-delivery", map[string]string{"SHOP_EVENTS_DELIVERY": "inside-tx"}, "SHOP_EVENTS_DELIVERY"},
		{"url-without-scheme", map[string]string{"SHOP_NATS_URL": "localhost:4222"}, "SHOP_NATS_URL"},
		{"url-of-another-protocol", map[string]string{"SHOP_NATS_URL": "http://localhost:4222"}, "SHOP_NATS_URL"},
		{"replicas-on-the-embedded-server", map[string]string{"SHOP_EVENTS_REPLICAS": "3"}, "SHOP_EVENTS_REPLICAS"},
		{"window-under-the-retry-span", map[string]string{"SHOP_EVENTS_DUPLICATE_WINDOW": "30s"}, "SHOP_EVENTS_DUPLICATE_WINDOW"},
		{"window-under-a-long-lease", map[string]string{"SHOP_LOCK_TTL": "20m"}, "SHOP_EVENTS_DUPLICATE_WINDOW"},
		{"missing-creds", map[string]string{"SHOP_NATS_URL": "nats://a:4222", "SHOP_NATS_CREDS": "/nonexistent/shop.creds"}, "SHOP_NATS_CREDS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.env["SHOP_ENV"] = "dev"
			_, err := Load(env(tc.env))
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("Load: %v; want an error naming %q", err, tc.want)
			}
		})
	}
}

func TestLogValueMasksTheNATSPassword(t *testing.T) {
	c, err := Load(env(map[string]string{"SHOP_ENV": "dev", "SHOP_NATS_URL": "nats://shop:s3cret@broker:4222"}))
	if err != nil {
		t.Fatal(err)
	}
	if v := c.LogValue().String(); strings.Contains(v, "s3cret") || !strings.Contains(v, "broker:4222") {
		t.Fatalf("printed config: %s", v)
	}
}
