package inventory

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/lockkit/local"
	"github.com/lockbench/shop/internal/problem"
)

// TestSKUSpellingMeansTheSameOnEveryDatabase: a SKU is lower case. On
// SQLite and MariaDB alike, another spelling of an existing SKU names no
// product (404 on the user routes), and the admin cannot create one (400),
// so no two rows or locks can differ only in case.
func TestSKUSpellingMeansTheSameOnEveryDatabase(t *testing.T) {
	gin.SetMode(gin.TestMode)
	for dbName, newDB := range databases(t) {
		t.Run(dbName, func(t *testing.T) {
			store := NewStore(newDB(t).DB, nil)
			locker := local.New()
			defer locker.Close()
			svc, err := NewService(store, Options{Strategy: StrategyLock, Locking: guard.Locking{Locker: locker}})
			if err != nil {
				t.Fatal(err)
			}
			r := gin.New()
			r.Use(problem.Errors(problem.Table(Problems())))
			d := &Domain{Service: svc, Store: store}
			d.Register(r.Group("/api/v1"), r.Group("/admin/v1"))
			send := func(method, path, body string) (int, string) {
				req := httptest.NewRequest(method, path, strings.NewReader(body))
				if body != "" {
					req.Header.Set("Content-Type", "application/json")
				}
				w := httptest.NewRecorder()
				r.ServeHTTP(w, req)
				return w.Code, w.Body.String()
			}
			if code, body := send("POST", "/admin/v1/products", `{"sku":"phone-x","name":"Phone","stock":5,"price_cents":1}`); code != http.StatusCreated {
				t.Fatalf("create phone-x: %d %s", code, body)
			}
			for _, tc := range []struct{ method, path, body, want string }{
				{"GET", "/api/v1/products/phone-x", "", "200"},
				{"GET", "/api/v1/products/PHONE-X", "", "404 SKUs are lower case"},
				{"GET", "/api/v1/products/Phone-x", "", "404 SKUs are lower case"},
				{"POST", "/admin/v1/products", `{"sku":"PHONE-X","name":"Phone","stock":9,"price_cents":1}`, "400 lower-case"},
				{"POST", "/admin/v1/products", `{"sku":"Other","name":"Other","stock":9,"price_cents":1}`, "400 lower-case"},
			} {
				code, body := send(tc.method, tc.path, tc.body)
				wantCode, wantDetail, _ := strings.Cut(tc.want, " ")
				if strconv.Itoa(code) != wantCode || !strings.Contains(body, wantDetail) {
					t.Errorf("%s %s: %d %s, want %s", tc.method, tc.path, code, body, tc.want)
				}
			}
			if p, err := store.Get(context.Background(), "phone-x"); err != nil || p.Stock != 5 {
				t.Errorf("phone-x after the refused writes: stock %d (%v), want 5", p.Stock, err)
			}
		})
	}
}
