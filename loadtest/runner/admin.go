package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// admin calls the admin API of one instance.
type admin struct {
	url, token string
}

// do sends body as JSON and decodes a 2xx answer into out (when not nil);
// any other status is an error with the answer's body.
func (a admin) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, a.url+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return err
	}
	if res.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s: %s", method, path, res.Status, bytes.TrimSpace(b))
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// product is what POST /admin/v1/products puts on sale (or restocks).
type product struct {
	SKU        string `json:"sku"`
	Name       string `json:"name"`
	Stock      int    `json:"stock"`
	PriceCents int    `json:"price_cents"`
}

func (a admin) addProduct(ctx context.Context, p product) error {
	return a.do(ctx, http.MethodPost, "/admin/v1/products", p, nil)
}

// audit reads GET /admin/v1/audit: {"ok":…, "<check>":{"total":n,…}},
// keeping the whole answer, indented, at rawPath.
func (a admin) audit(ctx context.Context, rawPath string) (ok bool, totals map[string]int64, err error) {
	var raw map[string]json.RawMessage
	if err := a.do(ctx, http.MethodGet, "/admin/v1/audit", nil, &raw); err != nil {
		return false, nil, err
	}
	if b, err := json.MarshalIndent(raw, "", "  "); err == nil {
		_ = os.WriteFile(rawPath, b, 0o644)
	}
	if err := json.Unmarshal(raw["ok"], &ok); err != nil {
		return false, nil, fmt.Errorf("audit: no ok member: %w", err)
	}
	totals = map[string]int64{}
	for name, v := range raw {
		var d struct {
			Total *int64 `json:"total"`
		}
		if json.Unmarshal(v, &d) == nil && d.Total != nil {
			totals[name] = *d.Total
		}
	}
	if len(totals) == 0 {
		return ok, nil, errors.New("audit: no checks in the answer")
	}
	return ok, totals, nil
}
