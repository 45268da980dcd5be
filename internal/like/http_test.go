package like

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/lockbench/shop/internal/auth"
	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/problem"
)

const (
	testSecret = "like-test-secret-of-at-least-32-bytes!"
	testAdmin  = "like-test-admin"
)

func router(t *testing.T, d *Domain) (*gin.Engine, *auth.Auth) {
	gin.SetMode(gin.TestMode)
	a := auth.New([]byte(testSecret), testAdmin)
	r := gin.New()
	r.Use(problem.Errors(Problems()), problem.Recover())
	d.Register(r.Group("/api/v1", a.User()), r.Group("/admin/v1", a.Admin()))
	return r, a
}

func TestHTTP(t *testing.T) {
	client := nodeClient(t)
	s := newService(t, client, Options{Locking: guard.Locking{Locker: redisLocker(t, client)}})
	r, a := router(t, &Domain{Service: s})
	token := func(user int64) string {
		tok, err := a.Token(user, time.Hour, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return "Bearer " + tok
	}
	for _, tc := range []struct {
		name, method, path, auth, body string
		status                         int
		want                           string // a fragment of the body
	}{
		{"register-201", "POST", "/admin/v1/entities", "Bearer " + testAdmin, `{"type":"post","id":"7","owner_id":42}`, 201, `"owner_id":42`},
		{"register-again-200", "POST", "/admin/v1/entities", "Bearer " + testAdmin, `{"type":"post","id":"7","owner_id":42}`, 200, `"id":"7"`},
		{"register-other-owner-409", "POST", "/admin/v1/entities", "Bearer " + testAdmin, `{"type":"post","id":"7","owner_id":43}`, 409, `owner-conflict`},
		{"register-missing-400", "POST", "/admin/v1/entities", "Bearer " + testAdmin, `{"type":"post","id":"8"}`, 400, `owner_id`},
		{"register-unknown-field-400", "POST", "/admin/v1/entities", "Bearer " + testAdmin, `{"type":"post","id":"8","owner":1}`, 400, `unknown field`},
		{"register-user-401", "POST", "/admin/v1/entities", token(1), `{"type":"post","id":"8","owner_id":1}`, 401, `admin token`},
		{"like-200", "PUT", "/api/v1/likes/post/7", token(1), "", 200, `"likes":1,"liked":true`},
		{"like-again-200", "PUT", "/api/v1/likes/post/7", token(1), "", 200, `"likes":1,"liked":true`},
		{"get-other-user-200", "GET", "/api/v1/likes/post/7", token(2), "", 200, `"likes":1,"liked":false`},
		{"received-200", "GET", "/api/v1/users/42/likes", token(2), "", 200, `{"user_id":42,"likes_received":1}`},
		{"received-bad-id-400", "GET", "/api/v1/users/x/likes", token(2), "", 400, `positive integer`},
		{"unlike-200", "DELETE", "/api/v1/likes/post/7", token(1), "", 200, `"likes":0,"liked":false`},
		{"unlike-again-200", "DELETE", "/api/v1/likes/post/7", token(1), "", 200, `"likes":0,"liked":false`},
		{"like-unknown-404", "PUT", "/api/v1/likes/post/8", token(1), "", 404, `entity-not-found`},
		{"like-bad-type-400", "PUT", "/api/v1/likes/POST/7", token(1), "", 400, `invalid-input`},
		{"like-anonymous-401", "PUT", "/api/v1/likes/post/7", "", "", 401, `unauthorized`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body))
			if tc.body != "" {
				req.Header.Set("Content-Type", "application/json")
			}
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			w := httptest.NewRecorder()
			r.ServeHTTP(w, req)
			if w.Code != tc.status || !strings.Contains(w.Body.String(), tc.want) {
				t.Fatalf("%s %s: %d %s; want %d with %s", tc.method, tc.path, w.Code, w.Body, tc.status, tc.want)
			}
			if w.Code >= 400 && w.Header().Get("Content-Type") != problem.ContentType {
				t.Fatalf("error with Content-Type %q", w.Header().Get("Content-Type"))
			}
			if !json.Valid(w.Body.Bytes()) {
				t.Fatalf("body is not JSON: %s", w.Body)
			}
		})
	}
}
