package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/flashsale/flashsale"
)

// Limits of the operator API.
const (
	maxAudit    = 1000
	defaultAudt = 100
)

// operator verifies that the caller holds an operator token: 401 without a
// valid token, 403 without the role.
func (s *Server) operator(c *fiber.Ctx) (flashsale.Principal, bool) {
	p, _, ok := s.guarded(c, ClassAdmin)
	if !ok {
		return p, false
	}
	if !p.Operator {
		_ = s.fail(c, errForbidden, 0)
		return p, false
	}
	return p, true
}

func actor(p flashsale.Principal) string { return strconv.FormatInt(p.UserID, 10) }

// adminSaleJSON is a sale as the operator API shows it.
type adminSaleJSON struct {
	ID                     int64                   `json:"id"`
	Name                   string                  `json:"name"`
	StartsAt               string                  `json:"startsAt"`
	EndsAt                 string                  `json:"endsAt,omitempty"`
	State                  string                  `json:"state"`
	AdmissionRatePerSecond int                     `json:"admissionRatePerSecond"`
	StockShards            int                     `json:"stockShards"`
	Allocation             string                  `json:"allocation"`
	ClaimWindowSeconds     int                     `json:"claimWindowSeconds"`
	ShuffleCommitment      string                  `json:"shuffleCommitment"`
	ShuffleSeed            string                  `json:"shuffleSeed,omitempty"`
	CreatedAt              string                  `json:"createdAt,omitempty"`
	Version                int64                   `json:"version"`
	Paused                 bool                    `json:"paused"`
	Message                *messageJSON            `json:"message,omitempty"`
	Items                  []adminItemJSON         `json:"items"`
	Queue                  *flashsale.QueueFigures `json:"queue,omitempty"`
	Access                 flashsale.SaleAccess    `json:"access"`
}

type adminItemJSON struct {
	ID         int64  `json:"id"`
	ProductID  int64  `json:"productId"`
	Name       string `json:"name"`
	ImageURL   string `json:"imageUrl,omitempty"`
	Currency   string `json:"currency"`
	Quantity   int64  `json:"quantity"`
	PriceCents int64  `json:"priceCents"`
	*itemFiguresJSON
}

// messageJSON is the operator's message to the queue.
type messageJSON struct {
	Text string `json:"text"`
	AtMs int64  `json:"atMs"`
}

func saleMessage(sale *flashsale.Sale) *messageJSON {
	if sale.Message == "" {
		return nil
	}
	return &messageJSON{Text: sale.Message, AtMs: sale.MessageAt.UnixMilli()}
}

type itemFiguresJSON struct {
	Remaining int64 `json:"remaining"`
	Sold      int64 `json:"sold"`
	Paid      int64 `json:"paid"`
	Expired   int64 `json:"expired"`
	Cancelled int64 `json:"cancelled"`
	Rejected  int64 `json:"rejected"`
}

// adminView renders sale; with figures (may be nil) per item and the
// sale's sold-out state taken from them.
func (s *Server) adminView(sale *flashsale.Sale, figs []flashsale.ItemFigures, now time.Time) adminSaleJSON {
	byItem := make(map[int64]flashsale.ItemFigures, len(figs))
	for _, f := range figs {
		byItem[f.ItemID] = f
	}
	v := adminSaleJSON{
		ID:                     sale.ID,
		Name:                   sale.Name,
		StartsAt:               fmtTime(sale.StartsAt),
		EndsAt:                 fmtTime(sale.EndsAt),
		AdmissionRatePerSecond: sale.AdmissionRatePerSecond,
		StockShards:            sale.Shards(),
		Allocation:             allocationOf(sale),
		ClaimWindowSeconds:     int(sale.Window() / time.Second),
		ShuffleCommitment:      sale.ShuffleCommitment,
		CreatedAt:              fmtTime(sale.CreatedAt),
		Version:                sale.Version,
		Paused:                 sale.Paused,
		Message:                saleMessage(sale),
		Items:                  make([]adminItemJSON, len(sale.Items)),
		Access:                 sale.Access,
	}
	if s.seedPublic(sale, now) {
		v.ShuffleSeed = sale.SeedHex()
	}
	all := len(sale.Items) > 0
	for i, it := range sale.Items {
		v.Items[i] = adminItemJSON{ID: it.ID, ProductID: it.ProductID, Name: it.Name, ImageURL: it.ImageURL, Currency: it.Currency,
			Quantity: it.Quantity, PriceCents: it.PriceCents}
		soldOut := s.d.Purchase.SoldOut(it.ID)
		if f, ok := byItem[it.ID]; ok {
			v.Items[i].itemFiguresJSON = &itemFiguresJSON{
				Remaining: f.Remaining, Sold: f.Sold, Paid: f.Paid,
				Expired: f.Expired, Cancelled: f.Cancelled, Rejected: f.Rejected,
			}
			soldOut = f.Remaining <= 0
		}
		all = all && soldOut
	}
	v.State = string(sale.State(now, all))
	return v
}

// createSaleRequest is the body of POST /api/admin/sales. Pointers tell a
// missing field from a zero.
type createSaleRequest struct {
	Name                   *string             `json:"name"`
	StartsAt               *string             `json:"startsAt"`
	EndsAt                 *string             `json:"endsAt"`
	AdmissionRatePerSecond *int                `json:"admissionRatePerSecond"`
	StockShards            *int                `json:"stockShards"` // absent: 1
	Allocation             *string             `json:"allocation"`  // absent: queue
	ClaimWindowSeconds     *int                `json:"claimWindowSeconds"`
	Access                 json.RawMessage     `json:"access"` // absent: open
	Items                  []createItemRequest `json:"items"`
}

// allocationOf is the sale's allocation as the API names it ("" is race).
func allocationOf(sale *flashsale.Sale) string {
	if sale.QueueOrder() {
		return flashsale.AllocationQueue
	}
	return flashsale.AllocationRace
}

type createItemRequest struct {
	ProductID  *int64  `json:"productId"`
	Quantity   *int64  `json:"quantity"`
	PriceCents *int64  `json:"priceCents"`
	Name       *string `json:"name"`     // absent: "Product <productId>"
	ImageURL   *string `json:"imageUrl"` // absent: none
	Currency   *string `json:"currency"` // absent: USD
}

// parseSaleRequest decodes a create body and returns the sale to store. The
// body's own faults (a missing field, a malformed time) are found here; the
// rules of a sale are Sale.Validate's.
func parseSaleRequest(body []byte) (flashsale.Sale, error) {
	var req createSaleRequest
	if err := decodeStrict(body, &req); err != nil {
		return flashsale.Sale{}, err
	}
	var sale flashsale.Sale
	if req.Name != nil {
		sale.Name = *req.Name
	}
	if req.StartsAt != nil {
		t, err := time.Parse(time.RFC3339, *req.StartsAt)
		if err != nil {
			return sale, flashsale.Invalid("startsAt", "not an RFC 3339 time")
		}
		sale.StartsAt = t.UTC()
	}
	if req.EndsAt != nil {
		e, err := time.Parse(time.RFC3339, *req.EndsAt)
		if err != nil {
			return sale, flashsale.Invalid("endsAt", "not an RFC 3339 time")
		}
		if e.IsZero() {
			// A Sale reads a zero EndsAt as no end; the zero instant
			// sent as an end is one before any start.
			return sale, flashsale.Invalid("endsAt", "must be after startsAt")
		}
		sale.EndsAt = e.UTC()
	}
	if req.AdmissionRatePerSecond == nil {
		return sale, flashsale.Invalid("admissionRatePerSecond", "required")
	}
	sale.AdmissionRatePerSecond = *req.AdmissionRatePerSecond
	if req.StockShards != nil {
		if *req.StockShards < 1 {
			return sale, flashsale.Invalid("stockShards", "must be 1 to %d", flashsale.MaxStockShards)
		}
		sale.StockShards = *req.StockShards
	}
	if req.Allocation != nil {
		if *req.Allocation == "" {
			return sale, flashsale.Invalid("allocation", "must be %q or %q", flashsale.AllocationQueue, flashsale.AllocationRace)
		}
		sale.Allocation = *req.Allocation
	}
	if req.ClaimWindowSeconds != nil {
		w := *req.ClaimWindowSeconds
		if w < 1 || w > int(flashsale.MaxClaimWindow/time.Second) {
			return sale, flashsale.Invalid("claimWindowSeconds", "must be %d to %d seconds",
				int(flashsale.MinClaimWindow/time.Second), int(flashsale.MaxClaimWindow/time.Second))
		}
		sale.ClaimWindow = time.Duration(w) * time.Second
	}
	if len(req.Access) > 0 && string(req.Access) != "null" {
		a, err := flashsale.ParseAccess(req.Access)
		if err != nil {
			return sale, err
		}
		sale.Access = a
	}
	sale.Items = make([]flashsale.Item, len(req.Items))
	for i, it := range req.Items {
		switch {
		case it.ProductID == nil:
			return sale, flashsale.Invalid(fmt.Sprintf("items[%d].productId", i), "required")
		case it.Quantity == nil:
			return sale, flashsale.Invalid(fmt.Sprintf("items[%d].quantity", i), "required")
		case it.PriceCents == nil:
			return sale, flashsale.Invalid(fmt.Sprintf("items[%d].priceCents", i), "required")
		}
		item := flashsale.Item{ProductID: *it.ProductID, Quantity: *it.Quantity, PriceCents: *it.PriceCents}
		if it.Name != nil {
			if *it.Name == "" {
				return sale, flashsale.Invalid(fmt.Sprintf("items[%d].name", i), "must not be empty (leave it out for the default)")
			}
			item.Name = *it.Name
		}
		if it.ImageURL != nil {
			item.ImageURL = *it.ImageURL
		}
		if it.Currency != nil {
			if *it.Currency == "" {
				return sale, flashsale.Invalid(fmt.Sprintf("items[%d].currency", i), "must be an ISO 4217 code (three upper-case letters)")
			}
			item.Currency = *it.Currency
		}
		sale.Items[i] = item
	}
	if err := sale.Validate(); err != nil {
		return sale, err
	}
	sale.Name = strings.TrimSpace(sale.Name)
	for i := range sale.Items {
		sale.Items[i].Name = strings.TrimSpace(sale.Items[i].Name)
	}
	return sale, nil
}

// updateSaleRequest is the body of PATCH /api/admin/sales/{saleId}.
type updateSaleRequest struct {
	Name                   *string         `json:"name"`
	AdmissionRatePerSecond *int            `json:"admissionRatePerSecond"`
	EndsAt                 *string         `json:"endsAt"`
	Access                 json.RawMessage `json:"access"`
}

func parseUpdateRequest(body []byte) (flashsale.SaleUpdate, error) {
	var req updateSaleRequest
	var u flashsale.SaleUpdate
	if err := decodeStrict(body, &req); err != nil {
		return u, err
	}
	if req.Name != nil {
		n := strings.TrimSpace(*req.Name)
		if n == "" {
			return u, flashsale.Invalid("name", "must not be empty")
		}
		if len(n) > flashsale.MaxSaleNameLen {
			return u, flashsale.Invalid("name", "at most %d bytes", flashsale.MaxSaleNameLen)
		}
		u.Name = &n
	}
	if req.AdmissionRatePerSecond != nil {
		if *req.AdmissionRatePerSecond < 1 {
			return u, flashsale.Invalid("admissionRatePerSecond", "must be at least 1")
		}
		r := *req.AdmissionRatePerSecond
		u.AdmissionRatePerSecond = &r
	}
	if req.EndsAt != nil {
		e, err := time.Parse(time.RFC3339, *req.EndsAt)
		if err != nil {
			return u, flashsale.Invalid("endsAt", "not an RFC 3339 time")
		}
		e = e.UTC()
		u.EndsAt = &e
	}
	if len(req.Access) > 0 {
		a, err := flashsale.ParseAccess(req.Access)
		if err != nil {
			return u, err
		}
		u.Access = &a
	}
	return u, nil
}

// decodeStrict decodes one JSON object into v, refusing unknown fields,
// wrong types and trailing data with an INVALID error that names the field.
func decodeStrict(body []byte, v any) error {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return flashsale.Errorf(flashsale.CodeInvalid, "request body required")
	}
	if body[0] != '{' {
		return flashsale.Errorf(flashsale.CodeInvalid, "request body must be a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return flashsale.Errorf(flashsale.CodeInvalid, "malformed JSON: data after the object")
	}
	return nil
}

func jsonError(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		field := te.Field
		if field == "" {
			field = "body"
		}
		return flashsale.Invalid(field, "wrong type (%s)", te.Value)
	}
	const unknown = "json: unknown field "
	if msg := err.Error(); strings.HasPrefix(msg, unknown) {
		name, uerr := strconv.Unquote(strings.TrimPrefix(msg, unknown))
		if uerr != nil {
			name = strings.TrimPrefix(msg, unknown)
		}
		return flashsale.Invalid(name, "unknown field")
	}
	return flashsale.Errorf(flashsale.CodeInvalid, "malformed JSON")
}

// adminCreate is POST /api/admin/sales.
func (s *Server) adminCreate(c *fiber.Ctx) error {
	op, ok := s.operator(c)
	if !ok {
		return nil
	}
	sale, err := parseSaleRequest(c.Body())
	if err != nil {
		return err
	}
	sale.CreatedBy = strconv.FormatInt(op.UserID, 10)
	ctx, cancel := s.reqCtx()
	defer cancel()
	stored, err := s.d.SaleAdmin.Create(ctx, sale)
	if err != nil {
		return err
	}
	c.Status(http.StatusCreated)
	c.Location("/api/admin/sales/" + strconv.FormatInt(stored.ID, 10))
	setETag(c, stored.Version)
	return c.JSON(s.adminView(&stored, nil, s.now()))
}

// adminList is GET /api/admin/sales.
func (s *Server) adminList(c *fiber.Ctx) error {
	if _, ok := s.operator(c); !ok {
		return nil
	}
	ctx, cancel := s.reqCtx()
	defer cancel()
	sales, err := s.d.SaleAdmin.List(ctx)
	if err != nil {
		return err
	}
	now := s.now()
	out := make([]adminSaleJSON, len(sales))
	for i := range sales {
		out[i] = s.adminView(&sales[i], nil, now)
	}
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.JSON(out)
}

// adminGet is GET /api/admin/sales/{saleId}: the sale with live figures.
func (s *Server) adminGet(c *fiber.Ctx) error {
	if _, ok := s.operator(c); !ok {
		return nil
	}
	id, ok := parseID(c.Params("saleId"))
	if !ok {
		return errBadSaleID
	}
	ctx, cancel := s.reqCtx()
	defer cancel()
	sale, err := s.d.SaleAdmin.Get(ctx, id)
	if err != nil {
		return err
	}
	figs, err := s.d.SaleAdmin.Figures(ctx, id)
	if err != nil {
		return err
	}
	q, err := s.d.Queue.Figures(ctx, id)
	if err != nil {
		return err
	}
	v := s.adminView(&sale, figs, s.now())
	v.Queue = &q
	setETag(c, sale.Version)
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.JSON(v)
}

// adminUpdate is PATCH /api/admin/sales/{saleId}.
func (s *Server) adminUpdate(c *fiber.Ctx) error {
	op, ok := s.operator(c)
	if !ok {
		return nil
	}
	id, ok := parseID(c.Params("saleId"))
	if !ok {
		return errBadSaleID
	}
	u, err := parseUpdateRequest(c.Body())
	if err != nil {
		return err
	}
	u.Actor = strconv.FormatInt(op.UserID, 10)
	return s.saleWrite(c, id, func(ctx context.Context, ifVersion int64) (flashsale.Sale, error) {
		u.IfVersion = ifVersion
		return s.d.SaleAdmin.Update(ctx, id, u)
	})
}

// sendRaw answers 200 with a JSON document from a store.
func sendRaw(c *fiber.Ctx, body json.RawMessage) error {
	c.Set(fiber.HeaderCacheControl, "no-store")
	c.Response().Header.SetContentType(fiber.MIMEApplicationJSON)
	return c.Send(body)
}

// adminSettingsGet is GET /api/admin/settings.
func (s *Server) adminSettingsGet(c *fiber.Ctx) error {
	if _, ok := s.operator(c); !ok {
		return nil
	}
	ctx, cancel := s.reqCtx()
	defer cancel()
	body, err := s.d.Settings.Get(ctx)
	if err != nil {
		return err
	}
	setETag(c, settingsVersion(body))
	return sendRaw(c, body)
}

// adminSettingsPut is PUT /api/admin/settings: the store validates the
// document; the gateway only checks that it is one JSON object.
func (s *Server) adminSettingsPut(c *fiber.Ctx) error {
	p, ok := s.operator(c)
	if !ok {
		return nil
	}
	body := bytes.TrimSpace(c.Body())
	if len(body) == 0 || body[0] != '{' || !json.Valid(body) {
		return flashsale.Errorf(flashsale.CodeInvalid, "request body must be a JSON object")
	}
	ifv, err := parseIfMatch(c.Get(fiber.HeaderIfMatch))
	if err != nil {
		return err
	}
	ctx, cancel := s.reqCtx()
	defer cancel()
	stored, err := s.d.Settings.PutIf(ctx, actor(p), ifv, bytes.Clone(body))
	if flashsale.ErrorCode(err) == flashsale.CodeVersionConflict {
		current, gerr := s.d.Settings.Get(ctx)
		if gerr != nil {
			return gerr
		}
		setETag(c, settingsVersion(current))
		return sendConflict(c, err, current)
	}
	if err != nil {
		return err
	}
	setETag(c, settingsVersion(stored))
	return sendRaw(c, stored)
}

// adminPreset is POST /api/admin/settings/preset/{name}.
func (s *Server) adminPreset(c *fiber.Ctx) error {
	p, ok := s.operator(c)
	if !ok {
		return nil
	}
	name := c.Params("name")
	if !validPresetName(name) {
		return flashsale.Invalid("name", "not a preset name")
	}
	ctx, cancel := s.reqCtx()
	defer cancel()
	stored, err := s.d.Settings.ApplyPreset(ctx, actor(p), strings.Clone(name))
	if err != nil {
		return err
	}
	return sendRaw(c, stored)
}

// adminAudit is GET /api/admin/audit?limit=N (default 100, at most 1000).
func (s *Server) adminAudit(c *fiber.Ctx) error {
	if _, ok := s.operator(c); !ok {
		return nil
	}
	limit := defaultAudt
	if q := c.Query("limit"); q != "" {
		n, ok := parseID(q)
		if !ok || n > maxAudit {
			return flashsale.Invalid("limit", "must be 1..%d", maxAudit)
		}
		limit = int(n)
	}
	ctx, cancel := s.reqCtx()
	defer cancel()
	body, err := s.d.Settings.Audit(ctx, limit)
	if err != nil {
		return err
	}
	return sendRaw(c, body)
}

// adminDefense is GET /api/admin/defense: the Guard's counters, which
// are the fleet's (summed over the live gateways, each one's share in
// "gateways").
func (s *Server) adminDefense(c *fiber.Ctx) error {
	if _, ok := s.operator(c); !ok {
		return nil
	}
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.JSON(s.d.Guard.Counters())
}
