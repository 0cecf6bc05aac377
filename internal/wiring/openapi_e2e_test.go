package wiring_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/pb33f/libopenapi-validator/config"
	verrors "github.com/pb33f/libopenapi-validator/errors"
	"github.com/pb33f/libopenapi-validator/schema_validation"
	"github.com/pb33f/libopenapi/datamodel/high/base"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring/apptest"
)

// openAPIFile is the API description the answers are checked against.
const openAPIFile = "../../docs/openapi.yaml"

// specCheck sends requests to a stack and validates each request and its
// answer against docs/openapi.yaml: path, parameters, security, body,
// status and the body's schema.
type specCheck struct {
	t       *testing.T
	s       *apptest.Stack
	v       validator.Validator
	schemas map[string]*base.Schema // components.schemas
}

func newSpecCheck(t *testing.T, s *apptest.Stack) *specCheck {
	t.Helper()
	spec, err := os.ReadFile(openAPIFile)
	if err != nil {
		t.Fatalf("read %s: %v", openAPIFile, err)
	}
	doc, err := libopenapi.NewDocument(spec)
	if err != nil {
		t.Fatalf("parse %s: %v", openAPIFile, err)
	}
	// Every schema of what the server sends states additionalProperties,
	// so the schema checks alone refuse an undocumented field (the
	// validator's strict mode would also refuse the keys of documented
	// maps).
	v, errs := validator.NewValidator(doc, config.WithFormatAssertions())
	if len(errs) > 0 {
		t.Fatalf("validator for %s: %v", openAPIFile, errs)
	}
	if ok, verrs := v.ValidateDocument(); !ok {
		for _, e := range verrs {
			t.Errorf("%s: %s", openAPIFile, describe(e))
		}
		t.FailNow()
	}
	model, err := doc.BuildV3Model()
	if err != nil {
		t.Fatalf("build %s: %v", openAPIFile, err)
	}
	schemas := map[string]*base.Schema{}
	for name, proxy := range model.Model.Components.Schemas.FromOldest() {
		schemas[name] = proxy.Schema()
	}
	return &specCheck{t: t, s: s, v: v, schemas: schemas}
}

// wsSchemas are the components.schemas of the waiting room's server
// messages (the queue operation's x-websocket-messages), by message type.
var wsSchemas = map[string]string{
	"status":    "QueueStatus",
	"admitted":  "WsAdmitted",
	"challenge": "PowChallenge",
	"error":     "WsError",
	"message":   "WsMessage",
}

// wsMessage validates one server message of the waiting room against the
// schema of its type and returns its type.
func (c *specCheck) wsMessage(data []byte) string {
	c.t.Helper()
	var m struct{ Type string }
	if err := json.Unmarshal(data, &m); err != nil {
		c.t.Fatalf("WebSocket message %s: %v", data, err)
	}
	name, ok := wsSchemas[m.Type]
	if !ok {
		c.t.Fatalf("WebSocket message of undocumented type %q: %s", m.Type, data)
	}
	if ok, errs := schema_validation.NewSchemaValidator(config.WithFormatAssertions()).ValidateSchemaBytes(c.schemas[name], data); !ok {
		for _, e := range errs {
			c.t.Errorf("WebSocket message %s does not match %s: %s", data, name, describe(e))
		}
	}
	return m.Type
}

// wsJoin opens the sale's waiting room, sends first and returns the types
// of the validated server messages, up to the first of one of the types
// until.
func (c *specCheck) wsJoin(saleID int64, first any, until ...string) []string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second) // guards against a hang only
	defer cancel()
	url := strings.Replace(c.s.App.PublicURL, "http://", "ws://", 1) + fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID)
	conn, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		c.t.Fatalf("dial %s: %v", url, err)
	}
	defer conn.CloseNow()
	msg, err := json.Marshal(first)
	if err != nil {
		c.t.Fatal(err)
	}
	if err := conn.Write(ctx, websocket.MessageText, msg); err != nil {
		c.t.Fatalf("write: %v", err)
	}
	var types []string
	for {
		_, data, err := conn.Read(ctx)
		if err != nil {
			c.t.Fatalf("read after %v: %v", types, err)
		}
		typ := c.wsMessage(data)
		types = append(types, typ)
		if slices.Contains(until, typ) {
			return types
		}
	}
}

// describe renders a validation error with where and why its schema
// checks failed.
func describe(e *verrors.ValidationError) string {
	out := e.Message + ": " + e.Reason
	for _, se := range e.SchemaValidationErrors {
		out += fmt.Sprintf("\n    at %s (%s): %s", se.FieldPath, se.KeywordLocation, se.Reason)
	}
	return out
}

// call sends a request to the public (admin false) or admin listener and
// validates it and its answer; body is nil or a value sent as JSON; hdr
// are header name/value pairs.
func (c *specCheck) call(admin bool, method, path, bearer string, body any, hdr ...string) apptest.Resp {
	c.t.Helper()
	return c.send(true, admin, method, path, bearer, body, hdr...)
}

// callInvalid sends a request the file rightly refuses to the public
// listener and validates the answer only.
func (c *specCheck) callInvalid(method, path, bearer string, body any, hdr ...string) apptest.Resp {
	c.t.Helper()
	return c.send(false, false, method, path, bearer, body, hdr...)
}

func (c *specCheck) send(checkRequest, admin bool, method, path, bearer string, body any, hdr ...string) apptest.Resp {
	c.t.Helper()
	var payload []byte
	if body != nil {
		var err error
		if payload, err = json.Marshal(body); err != nil {
			c.t.Fatal(err)
		}
	}
	base := c.s.App.PublicURL
	if admin {
		base = c.s.App.AdminURL
	}
	return c.exchange(checkRequest, base, method, path, bearer, payload, hdr...)
}

// exchange sends payload (nil: no body) as it is and validates the answer,
// and the request too when checkRequest.
func (c *specCheck) exchange(checkRequest bool, base, method, path, bearer string, payload []byte, hdr ...string) apptest.Resp {
	c.t.Helper()
	newReq := func() *http.Request {
		var rd io.Reader
		if payload != nil {
			rd = bytes.NewReader(payload)
		}
		req, err := http.NewRequest(method, base+path, rd)
		if err != nil {
			c.t.Fatal(err)
		}
		if payload != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		return req
	}
	resp, err := c.s.Client.Do(newReq())
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		c.t.Fatalf("%s %s: read: %v", method, path, err)
	}
	resp.Body = io.NopCloser(bytes.NewReader(raw))
	validate := c.v.ValidateHttpResponse
	if checkRequest {
		validate = c.v.ValidateHttpRequestResponse
	}
	if ok, errs := validate(newReq(), resp); !ok {
		var why []string
		for _, e := range errs {
			why = append(why, describe(e))
		}
		shown := raw
		if len(shown) > 400 {
			shown = append(shown[:400:400], "..."...)
		}
		c.t.Errorf("%s %s → %d %s\n  does not match %s:\n  %s", method, path, resp.StatusCode, shown, openAPIFile,
			strings.Join(why, "\n  "))
	}
	a := apptest.Resp{Status: resp.StatusCode, Header: resp.Header, Raw: raw}
	_ = json.Unmarshal(raw, &a.Body)
	return a
}

// admitted joins the sale's queue by polling and waits for the admission
// token.
func (c *specCheck) admitted(user, saleID int64) string {
	c.t.Helper()
	tok := c.s.Token(user, false)
	path := fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID)
	c.s.Want(c.call(false, "POST", path, tok, nil), 200, "")
	return testenv.EventuallyValue(c.t, fmt.Sprintf("user %d to be admitted to sale %d", user, saleID), 15*time.Second, func() (string, bool) {
		a := c.call(false, "GET", path, tok, nil)
		c.s.Want(a, 200, "")
		at, _ := a.Body["admissionToken"].(string)
		return at, at != ""
	})
}

// untilRecorded repeats an order request until the order is in
// PostgreSQL: a read that answers payable, or an action that answers 200
// rather than 409 NOT_PAYABLE_YET ("retry shortly").
func (c *specCheck) untilRecorded(do func() apptest.Resp) apptest.Resp {
	c.t.Helper()
	var a apptest.Resp
	testenv.EventuallyF(c.t, func() string { return fmt.Sprintf("the order to be recorded (last %s)", a.Raw) }, 15*time.Second, func() bool {
		a = do()
		return !(a.Status == 409 && a.Body["error"] == "NOT_PAYABLE_YET" ||
			a.Status == 200 && a.Body["status"] == "PENDING" && a.Body["payable"] == false)
	})
	c.s.Want(a, 200, "")
	return a
}

// TestOpenAPIEndToEnd runs a drop through a whole stack and checks every
// request and answer against docs/openapi.yaml: an operator creates and
// reads a sale, shoppers queue, are admitted, buy, read, pay and cancel,
// are refused (not admitted, sold out, already purchased, unknown), and
// the operator reads the figures, settings, audit log and counters.
func TestOpenAPIEndToEnd(t *testing.T) {
	s := apptest.Start(t)
	c := newSpecCheck(t, s)
	op := s.Token(1, true)

	// The operator creates a sale: item A has one unit, item B five.
	created := c.call(false, "POST", "/api/admin/sales", op, map[string]any{
		"name": "openapi", "startsAt": time.Now().Add(-time.Second).UTC().Format(time.RFC3339),
		"admissionRatePerSecond": 10000, "allocation": "race",
		"items": []map[string]any{
			{"productId": 501, "quantity": 1, "priceCents": 1999},
			{"productId": 502, "quantity": 5, "priceCents": 2999},
		},
	})
	c.s.Want(created, 201, "")
	saleID := int64(created.Body["id"].(float64))
	var items []int64
	for _, it := range created.Body["items"].([]any) {
		items = append(items, int64(it.(map[string]any)["id"].(float64)))
	}
	itemA, itemB := items[0], items[1]
	salePath := fmt.Sprintf("/api/admin/sales/%d", saleID)
	c.s.Want(c.call(false, "GET", "/api/admin/sales", op, nil), 200, "")
	c.s.Want(c.call(false, "PATCH", salePath, op, map[string]any{"admissionRatePerSecond": 5000}), 200, "")
	c.s.Want(c.call(false, "GET", salePath, op, nil), 200, "")
	c.s.Want(c.call(false, "GET", salePath, s.Token(7, false), nil), 403, "FORBIDDEN")
	c.s.Want(c.callInvalid("POST", "/api/admin/sales", op, map[string]any{
		"name": "x", "startsAt": "2026-12-01T18:00:00Z", "admissionRatePerSecond": 5, "items": []any{},
	}), 400, "INVALID")

	// The public pages and sale data.
	c.s.Want(c.call(false, "GET", "/api/flash-sales/sales", "", nil), 200, "")
	c.s.Want(c.call(false, "GET", fmt.Sprintf("/api/flash-sales/sales/%d", saleID), "", nil), 200, "")
	c.s.Want(c.call(false, "GET", "/api/flash-sales/sales/987654", "", nil), 404, "NOT_FOUND")
	for _, p := range []string{"/", "/operator", fmt.Sprintf("/sales/%d", saleID)} {
		c.s.Want(c.call(false, "GET", p, "", nil), 200, "")
	}

	// A shopper queues, is admitted and buys A; a repeat is refused.
	at := c.admitted(100, saleID)
	// The draw record of the open sale (drawn at the first join, stored
	// by the leader right after), and refusals: unknown, and a sale not
	// yet open.
	waitFor(t, "the open sale's draw record", func() bool {
		return c.call(false, "GET", fmt.Sprintf("/api/flash-sales/sales/%d/draw", saleID), "", nil).Status == 200
	})
	c.s.Want(c.call(false, "GET", "/api/flash-sales/sales/987654/draw", "", nil), 404, "NOT_FOUND")
	later, err := s.App.CreateSale(context.Background(), flashsale.Sale{Name: "later", StartsAt: time.Now().Add(time.Hour), AdmissionRatePerSecond: 1, Allocation: flashsale.AllocationRace,
		Items: []flashsale.Item{{ProductID: 1, Quantity: 1, PriceCents: 100}}})
	if err != nil {
		t.Fatal(err)
	}
	c.s.Want(c.call(false, "GET", fmt.Sprintf("/api/flash-sales/sales/%d/draw", later.ID), "", nil), 409, "NOT_DRAWN")
	// A record with members: two shoppers join a sale before it opens.
	soon, err := s.App.CreateSale(context.Background(), flashsale.Sale{Name: "soon", StartsAt: time.Now().Add(time.Second), AdmissionRatePerSecond: 100, Allocation: flashsale.AllocationRace,
		Items: []flashsale.Item{{ProductID: 1, Quantity: 5, PriceCents: 100}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []int64{300, 301} {
		c.s.Want(c.call(false, "POST", fmt.Sprintf("/api/flash-sales/sales/%d/queue", soon.ID), s.Token(u, false), nil), 200, "")
	}
	c.admitted(300, soon.ID) // after opening: drawn
	c.admitted(301, soon.ID)
	var drawn apptest.Resp
	waitFor(t, "the draw record", func() bool {
		drawn = c.call(false, "GET", fmt.Sprintf("/api/flash-sales/sales/%d/draw", soon.ID), "", nil)
		return drawn.Status == 200
	})
	if n := drawn.Body["preQueueSize"]; n != 2.0 {
		t.Fatalf("draw record of two pre-queued shoppers: preQueueSize %v; %s", n, drawn.Raw)
	}
	shopper := s.Token(100, false)
	purchaseA := fmt.Sprintf("/api/flash-sales/items/%d/purchase", itemA)
	purchaseB := fmt.Sprintf("/api/flash-sales/items/%d/purchase", itemB)
	c.s.Want(c.call(false, "POST", purchaseA, s.Token(101, false), nil, "X-Admission-Token", "garbage"), 403, "NOT_ADMITTED")
	c.s.Want(c.call(false, "POST", purchaseA, s.Token(101, false), nil, "X-Admission-Token", at), 403, "NOT_ADMITTED")
	bought := c.call(false, "POST", purchaseA, shopper, nil, "X-Admission-Token", at)
	c.s.Want(bought, 202, "")
	orderID := bought.Body["orderId"].(string)
	again := c.call(false, "POST", purchaseB, shopper, nil, "X-Admission-Token", at)
	c.s.Want(again, 409, "ALREADY_PURCHASED")
	if again.Body["orderId"] != orderID {
		t.Fatalf("ALREADY_PURCHASED names %v, want %s", again.Body["orderId"], orderID)
	}

	// The order becomes payable once written; the shopper pays it.
	orderPath := "/api/flash-sales/orders/" + orderID
	c.untilRecorded(func() apptest.Resp { return c.call(false, "GET", orderPath, shopper, nil) })
	c.s.Want(c.call(false, "GET", fmt.Sprintf("/api/flash-sales/sales/%d/order", saleID), shopper, nil), 200, "")
	c.s.Want(c.call(false, "GET", orderPath, s.Token(101, false), nil), 404, "NOT_FOUND")
	c.untilRecorded(func() apptest.Resp {
		return c.call(false, "POST", orderPath+"/pay", shopper, map[string]string{"paymentToken": "tok"})
	})
	c.s.Want(c.call(false, "POST", orderPath+"/cancel", shopper, nil), 409, "ORDER_PAID")

	// A second shopper finds A sold out, buys B and cancels it.
	at2 := c.admitted(102, saleID)
	second := s.Token(102, false)
	c.s.Want(c.call(false, "POST", purchaseA, second, nil, "X-Admission-Token", at2), 410, "SOLD_OUT")
	c.s.Want(c.call(false, "GET", fmt.Sprintf("/api/flash-sales/sales/%d/order", saleID), second, nil), 404, "NOT_FOUND")
	b := c.call(false, "POST", purchaseB, second, nil, "X-Admission-Token", at2)
	c.s.Want(b, 202, "")
	c.untilRecorded(func() apptest.Resp {
		return c.call(false, "POST", "/api/flash-sales/orders/"+b.Body["orderId"].(string)+"/cancel", second, nil)
	})

	// The WebSocket waiting room: a join gets statuses and then the
	// admission; a message that is not a join gets an error.
	got := c.wsJoin(saleID, map[string]string{"type": "join", "accessToken": s.Token(103, false)}, "admitted")
	if got[0] != "status" {
		t.Fatalf("WebSocket messages %v, want a status first", got)
	}
	if got := c.wsJoin(saleID, map[string]string{"type": "hello"}, "error"); len(got) != 1 {
		t.Fatalf("WebSocket messages %v, want one error", got)
	}

	// The operator's reads and settings.
	c.s.Want(c.call(false, "GET", salePath, op, nil), 200, "")
	c.s.Want(c.call(false, "GET", "/api/admin/settings", op, nil), 200, "")
	var permissive map[string]any
	if err := json.Unmarshal([]byte(apptest.Permissive), &permissive); err != nil {
		t.Fatal(err)
	}
	c.s.Want(c.call(false, "PUT", "/api/admin/settings", op, permissive), 200, "")
	c.s.Want(c.call(false, "GET", "/api/admin/audit?limit=50", op, nil), 200, "")
	c.s.Want(c.call(false, "GET", "/api/admin/defense", op, nil), 200, "")
	c.s.Want(c.call(false, "POST", "/api/admin/settings/preset/normal", op, nil), 200, "")
	c.s.Want(c.call(false, "POST", "/api/admin/settings/preset/nonesuch", op, nil), 404, "NOT_FOUND")

	// The payment provider's callback, off without a payment secret (the
	// outcomes with one: payment_e2e_test.go).
	c.s.Want(c.callInvalid("POST", "/api/shop/orders/"+orderID+"/paid", "", map[string]any{"paymentId": "pi", "amountCents": 1999}), 403, "FORBIDDEN")

	// The admin port.
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		c.s.Want(c.call(true, "GET", p, "", nil), 200, "")
	}
}
