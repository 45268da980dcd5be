package loyalty

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/gin-gonic/gin"

	"github.com/lockbench/shop/internal/audit"
	"github.com/lockbench/shop/internal/auth"
	"github.com/lockbench/shop/internal/events"
	"github.com/lockbench/shop/internal/problem"
)

// Domain is the loyalty domain as cmd/shop wires it: the points route, the
// audit checks of the points and of the consumer's dead letters, and the
// reset of both.
type Domain struct {
	Store    *Store
	Consumer *events.ConsumerStore
}

// Register adds GET /users/{id}/points to api; there is no admin route.
func (d *Domain) Register(api, _ *gin.RouterGroup) {
	api.GET("/users/:id/points", problem.Handle(d.points))
}

// Reset implements audit.Resetter: points, the inbox, the marks' "done"
// and the dead letters go, so that events of orders placed after the
// reset (whose ids may start over) apply.
func (d *Domain) Reset(ctx context.Context, _ string) error {
	return errors.Join(d.Store.Reset(ctx), d.Consumer.Reset(ctx))
}

// ForgetFences forgets the lock dedup's fences (see cmd/shop).
func (d *Domain) ForgetFences(ctx context.Context) error { return d.Consumer.ForgetFences(ctx) }

// Checks are the loyalty invariants for the audit.
func (d *Domain) Checks() []audit.Check {
	return []audit.Check{
		{Name: "points_doubled", By: "by_order", Unit: "points", Run: d.Store.Doubled},
		{Name: "points_missing", By: "by_order", Unit: "points", Run: d.Store.Missing},
		{Name: "dead_letters", By: "by_reason", Run: d.Consumer.DeadLetters},
	}
}

func (d *Domain) points(c *gin.Context) error {
	raw := c.Param("id")
	id, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || id <= 0 {
		return problem.BadRequest(fmt.Sprintf("user id must be a positive integer, got %q", raw))
	}
	if err := auth.RequireSelf(c, id); err != nil {
		return err
	}
	b, err := d.Store.Points(c.Request.Context(), id)
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, b)
	return nil
}
