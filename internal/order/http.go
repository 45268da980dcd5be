package order

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockbench/shop/internal/audit"
	"github.com/lockbench/shop/internal/auth"
	"github.com/lockbench/shop/internal/idem"
	"github.com/lockbench/shop/internal/idem/keyed"
	"github.com/lockbench/shop/internal/problem"
)

// Problems are the order errors' rows of the API's problem table.
func Problems() []problem.Mapping {
	return []problem.Mapping{
		{Target: ErrNotFound, Status: http.StatusNotFound, Slug: "order-not-found", Title: "Order not found"},
		{Target: ErrCancelled, Status: http.StatusConflict, Slug: "order-cancelled", Title: "Order cancelled"},
		{Target: ErrTooLarge, Status: http.StatusUnprocessableEntity, Slug: "order-too-large", Title: "Order amount too large"},
		{Target: ErrUnpaidLimit, Status: http.StatusConflict, Slug: "unpaid-limit", Title: "Too many units awaiting payment"},
		{Target: ErrPaymentTooLate, Status: http.StatusConflict, Slug: "payment-too-late", Title: "Payment too late"},
	}
}

// Page sizes of GET /orders.
const (
	defaultPageSize = 20
	maxPageSize     = 100
)

// Domain is the order domain as cmd/shop wires it: the token route, the
// order routes, the audit checks.
type Domain struct {
	Service *Service
	Store   *Store
	Idem    *idem.Idem
}

// Register adds POST /idempotency-tokens, POST /orders (which requires an
// Idempotency-Key), POST /orders/{id}/pay (an optional one), GET /orders
// and GET /orders/{id} to api. No admin routes.
func (d *Domain) Register(api, _ *gin.RouterGroup) {
	d.Idem.Register(api)
	api.POST("/orders", d.Idem.Middleware(), problem.Handle(d.place))
	api.GET("/orders", problem.Handle(d.list))
	api.GET("/orders/:id", problem.Handle(d.get))
	// Pay takes the client's optional key, like every money-moving POST.
	// It is idempotent by itself (paying a paid order answers the same body
	// and debits nothing), so a 5xx is not stored: the retry runs again and
	// finds what the first attempt did.
	api.POST("/orders/:id/pay", problem.NoBody(), d.Idem.Guard(idem.Policy{RerunServerErrors: true}), problem.Handle(d.pay))
}

// Reset implements audit.Resetter.
func (d *Domain) Reset(ctx context.Context, fixture string) error { return d.Store.Reset(ctx, fixture) }

// ForgetFences sets every order's fence to 0; see Store.ForgetFences.
func (d *Domain) ForgetFences(ctx context.Context) error { return d.Store.ForgetFences(ctx) }

// Collectors are the order metrics read from the database at each scrape:
// shop_order_reserved_unpaid_units.
func (d *Domain) Collectors() []prometheus.Collector {
	return []prometheus.Collector{d.Store.ReservedUnpaidCollector()}
}

// Checks are the order invariants for the audit.
func (d *Domain) Checks() []audit.Check {
	return slices.Concat([]audit.Check{{Name: "duplicate_orders", By: "by_key", Run: d.Store.Duplicates}},
		d.Store.checks(d.Service.stuckAfter()), d.Store.eventChecks(d.Service.o.UnpublishedAfter))
}

type placeRequest struct {
	SKU      *string `json:"sku"`
	Quantity *int64  `json:"quantity"`
	// Pay reserves and pays in one transaction.
	Pay bool `json:"pay"`
}

func (d *Domain) place(c *gin.Context) error {
	var req placeRequest
	if err := problem.DecodeJSON(c, &req); err != nil {
		return err
	}
	if req.SKU == nil || req.Quantity == nil {
		return problem.BadRequest("sku and quantity are required")
	}
	keyed.Decide(c.Request.Context(), placed)
	o, _, err := d.Service.Place(c.Request.Context(), auth.UserID(c), idem.Key(c), *req.SKU, *req.Quantity, req.Pay)
	if err != nil {
		return err
	}
	idem.Reply(c, placed(&o))
	return nil
}

// placed is a placed order's answer, sent and recorded alike.
func placed(o *Order) keyed.Answer {
	return keyed.Answer{Status: http.StatusCreated, Body: o,
		Header: http.Header{"Location": {"/api/v1/orders/" + strconv.FormatInt(o.ID, 10)}}}
}

func (d *Domain) pay(c *gin.Context) error {
	id, err := orderID(c)
	if err != nil {
		return err
	}
	o, err := d.Service.Pay(c.Request.Context(), auth.UserID(c), id)
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, o)
	return nil
}

// get answers 404 for another user's order, as for a missing one: 403
// would confirm that the id exists.
func (d *Domain) get(c *gin.Context) error {
	id, err := orderID(c)
	if err != nil {
		return err
	}
	o, err := d.Service.Get(c.Request.Context(), auth.UserID(c), id)
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, o)
	return nil
}

func orderID(c *gin.Context) (int64, error) {
	raw := c.Param("id")
	id, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || id <= 0 {
		return 0, problem.BadRequest(fmt.Sprintf("order id must be a positive integer, got %q", raw))
	}
	return id, nil
}

// page is GET /orders' answer. NextCursor is absent on the last page.
type page struct {
	Orders     []Order `json:"orders"`
	NextCursor string  `json:"next_cursor,omitempty"`
}

// cursorPrefix versions the opaque cursor, so that its form may change
// without old cursors being misread.
const cursorPrefix = "o1:"

func encodeCursor(id int64) string {
	return base64.RawURLEncoding.EncodeToString([]byte(cursorPrefix + strconv.FormatInt(id, 10)))
}

func decodeCursor(s string) (int64, bool) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return 0, false
	}
	rest, ok := strings.CutPrefix(string(b), cursorPrefix)
	if !ok {
		return 0, false
	}
	id, err := strconv.ParseInt(rest, 10, 64)
	return id, err == nil && id > 0
}

// list answers the caller's orders, newest first. The cursor is the
// next_cursor of the page before: keyset pagination on the id, so a page
// neither repeats nor skips an order when new ones are placed meanwhile.
func (d *Domain) list(c *gin.Context) error {
	limit, before, err := pageQuery(c)
	if err != nil {
		return err
	}
	orders, more, err := d.Service.List(c.Request.Context(), auth.UserID(c), before, limit)
	if err != nil {
		return err
	}
	p := page{Orders: orders}
	if p.Orders == nil {
		p.Orders = []Order{}
	}
	if more {
		p.NextCursor = encodeCursor(orders[len(orders)-1].ID)
	}
	c.JSON(http.StatusOK, p)
	return nil
}

// pageQuery reads a list's limit (defaultPageSize when absent) and the id
// its cursor names (0 when absent).
func pageQuery(c *gin.Context) (limit int, before int64, err error) {
	limit = defaultPageSize
	if raw, ok := c.GetQuery("limit"); ok {
		n, err := strconv.Atoi(raw)
		if err != nil || n < 1 || n > maxPageSize {
			return 0, 0, problem.BadRequest(fmt.Sprintf("limit must be an integer from 1 to %d, got %q", maxPageSize, raw))
		}
		limit = n
	}
	if raw, ok := c.GetQuery("cursor"); ok {
		id, valid := decodeCursor(raw)
		if !valid {
			return 0, 0, problem.BadRequest(fmt.Sprintf("cursor %q is not a next_cursor this API returned", raw))
		}
		before = id
	}
	return limit, before, nil
}
