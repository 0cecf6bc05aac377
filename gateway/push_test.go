package gateway

import (
	"context"
	"sync"
	"testing"

	"github.com/flashsale/flashsale"
)

// recordingPush keeps what the push routes hand it (the push package's
// checks and Redis are tested through the whole stack in internal/wiring).
type recordingPush struct {
	mu    sync.Mutex
	calls []string
}

func (p *recordingPush) PublicKey() string { return "BPUB" }

func (p *recordingPush) Subscribe(_ context.Context, sale *flashsale.Sale, userID int64, body []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, "put "+string(body))
	if string(body) == "bad" {
		return flashsale.Invalid("endpoint", "must be https")
	}
	return nil
}

func (p *recordingPush) Unsubscribe(_ context.Context, saleID, userID int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, "delete")
	return nil
}

func TestPushRoutes(t *testing.T) {
	rec := &recordingPush{}
	e := newEnv(t, func(_ *Config, d *Deps) { d.Push = rec })
	auth7 := []string{"Authorization", bearer(e.token(7, false))}
	const fs = "/api/flash-sales"
	runCases(t, e, []routeCase{
		{name: "key", method: "GET", path: fs + "/push", wantStatus: 200, check: func(t *testing.T, r resp) {
			var b map[string]string
			r.json(t, &b)
			if b["publicKey"] != "BPUB" {
				t.Errorf("body %s, want the public key", r.body)
			}
		}},
		{name: "subscribe", method: "PUT", path: fs + "/sales/1/push", body: "sub", headers: auth7, wantStatus: 204},
		{name: "refused subscription", method: "PUT", path: fs + "/sales/1/push", body: "bad", headers: auth7, wantStatus: 400, wantCode: "INVALID"},
		{name: "no token", method: "PUT", path: fs + "/sales/1/push", body: "sub-no-token", wantStatus: 401, wantCode: "UNAUTHENTICATED"},
		{name: "malformed sale", method: "PUT", path: fs + "/sales/x/push", body: "sub-x", headers: auth7, wantStatus: 400, wantCode: "INVALID"},
		{name: "unknown sale", method: "PUT", path: fs + "/sales/99/push", body: "sub-99", headers: auth7, wantStatus: 404, wantCode: "NOT_FOUND"},
		{name: "ended sale", method: "PUT", path: fs + "/sales/3/push", body: "sub-ended", headers: auth7, wantStatus: 400, wantCode: "INVALID"},
		{name: "unsubscribe", method: "DELETE", path: fs + "/sales/1/push", headers: auth7, wantStatus: 204},
	})
	want := []string{"put sub", "put bad", "delete"}
	if len(rec.calls) != len(want) {
		t.Fatalf("calls %q, want %q: a refused request reached the store", rec.calls, want)
	}
	for i := range want {
		if rec.calls[i] != want[i] {
			t.Errorf("call %d = %q, want %q", i, rec.calls[i], want[i])
		}
	}
}

func TestPushRoutesOff(t *testing.T) {
	e := newEnv(t)
	auth7 := []string{"Authorization", bearer(e.token(7, false))}
	runCases(t, e, []routeCase{
		{name: "key", method: "GET", path: "/api/flash-sales/push", wantStatus: 404, wantCode: "NOT_FOUND"},
		{name: "subscribe", method: "PUT", path: "/api/flash-sales/sales/1/push", body: "{}", headers: auth7, wantStatus: 404, wantCode: "NOT_FOUND"},
		{name: "unsubscribe", method: "DELETE", path: "/api/flash-sales/sales/1/push", headers: auth7, wantStatus: 404, wantCode: "NOT_FOUND"},
	})
}
