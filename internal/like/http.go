package like

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/gin-gonic/gin"

	"github.com/lockbench/shop/internal/audit"
	"github.com/lockbench/shop/internal/auth"
	"github.com/lockbench/shop/internal/problem"
)

// Problems are the like errors' rows of the API's problem table.
func Problems() []problem.Mapping {
	return []problem.Mapping{
		{Target: ErrEntityNotFound, Status: http.StatusNotFound, Slug: "entity-not-found", Title: "Entity not found"},
		{Target: ErrOwnerConflict, Status: http.StatusConflict, Slug: "owner-conflict", Title: "Entity has another owner"},
		{Target: ErrInvalidEntity, Status: http.StatusBadRequest, Slug: "invalid-input", Title: "Invalid input"},
		// No Retry-After, as for the database's lost commit reply: the
		// change may have landed.
		{Target: ErrOutcomeUnknown, Status: http.StatusServiceUnavailable, Slug: "outcome-unknown", Title: "Outcome unknown",
			Detail: "the Redis connection broke before it confirmed this like or unlike, which may or may not have been applied; " +
				"sending it again is safe (a like or unlike is idempotent per user), and GET /api/v1/likes/{type}/{id} shows the like as it stands"},
	}
}

// Domain is the like domain as cmd/shop wires it: routes, fixtures and the
// audit check.
type Domain struct {
	Service *Service
}

// Register adds the user routes to api (which authenticates users) and the
// admin route to admin (which checks the admin token).
func (d *Domain) Register(api, admin *gin.RouterGroup) {
	api.GET("/likes/:type/:id", problem.Handle(d.get))
	api.PUT("/likes/:type/:id", problem.NoBody(), problem.Handle(d.like))
	api.DELETE("/likes/:type/:id", problem.NoBody(), problem.Handle(d.unlike))
	api.GET("/users/:id/likes", problem.Handle(d.received))
	admin.POST("/entities", problem.Handle(d.register))
}

// Reset implements audit.Resetter.
func (d *Domain) Reset(ctx context.Context, fixture string) error {
	return d.Service.Reset(ctx, fixture)
}

// Checks are the like invariants for the audit: like_drift by owner.
func (d *Domain) Checks() []audit.Check {
	return []audit.Check{{Name: "like_drift", By: "by_owner", Unit: "likes", Run: d.Service.Drift}}
}

func ref(c *gin.Context) Ref { return Ref{Type: c.Param("type"), ID: c.Param("id")} }

func (d *Domain) get(c *gin.Context) error { return d.answer(c, d.Service.Get) }

// like and unlike are PUT and DELETE: the same request twice leaves the
// same state, and both answer with it.
func (d *Domain) like(c *gin.Context) error   { return d.answer(c, d.Service.Like) }
func (d *Domain) unlike(c *gin.Context) error { return d.answer(c, d.Service.Unlike) }

func (d *Domain) answer(c *gin.Context, op func(context.Context, int64, Ref) (State, error)) error {
	st, err := op(c.Request.Context(), auth.UserID(c), ref(c))
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, st)
	return nil
}

// Received is the body of GET /api/v1/users/{id}/likes.
type Received struct {
	UserID   int64 `json:"user_id"`
	Received int64 `json:"likes_received"`
}

// received is public to every authenticated user, as like counts are.
func (d *Domain) received(c *gin.Context) error {
	raw := c.Param("id")
	id, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || id <= 0 {
		return problem.BadRequest(fmt.Sprintf("user id must be a positive integer, got %q", raw))
	}
	n, err := d.Service.Received(c.Request.Context(), id)
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, Received{UserID: id, Received: n})
	return nil
}

type registerRequest struct {
	Type  *string `json:"type"`
	ID    *string `json:"id"`
	Owner *int64  `json:"owner_id"`
}

func (d *Domain) register(c *gin.Context) error {
	var req registerRequest
	if err := problem.DecodeJSON(c, &req); err != nil {
		return err
	}
	if req.Type == nil || req.ID == nil || req.Owner == nil {
		return problem.BadRequest("type, id and owner_id are required")
	}
	e := Entity{Ref: Ref{Type: *req.Type, ID: *req.ID}, Owner: *req.Owner}
	created, err := d.Service.Register(c.Request.Context(), e)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	c.JSON(status, e)
	return nil
}
