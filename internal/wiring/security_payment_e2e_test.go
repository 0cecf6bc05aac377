package wiring_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring"
	"github.com/flashsale/flashsale/internal/wiring/apptest"
)

// TestSecurityPaymentReplayOntoOtherOrder: a verified callback answered
// 404 (its order unknown) or 400 (a body refused after the signature) is
// taken by someone who sends it again, to its own path and onto another
// order of the same price: the other order refuses it (the signature
// binds the path's order) and its own path answers REPLAYED (every
// verified signature is recorded, whatever the answer). Nothing is paid
// and no payment is recorded.
func TestSecurityPaymentReplayOntoOtherOrder(t *testing.T) {
	s := startPayStack(t)
	saleID, items := s.createSale(5)
	victim := s.bought(100, saleID, items[0])
	now := time.Now()

	const unknown = "00000000-0000-4000-8000-0000000000aa"
	body := payBody("pi_captured", 1999)
	sig := paySig(unknown, now, body)
	s.Want(s.callback(unknown, body, sig, true), 404, "NOT_FOUND")
	lower := payBodyIn("pi_lower", 1999, "usd")
	lowerSig := paySig(unknown, now, lower)
	s.Want(s.callback(unknown, lower, lowerSig, false), 400, "INVALID")

	for _, r := range []struct {
		name, order string
		body        []byte
		sig         string
		valid       bool // the body is one the file allows
		status      int
		code        string
	}{
		{"404 onto another order", victim, body, sig, true, 401, "BAD_SIGNATURE"},
		{"404 again", unknown, body, sig, true, 409, "REPLAYED"},
		{"400 onto another order", victim, lower, lowerSig, false, 401, "BAD_SIGNATURE"},
		{"400 again", unknown, lower, lowerSig, false, 409, "REPLAYED"},
	} {
		got := s.callback(r.order, r.body, r.sig, r.valid)
		if got.Status != r.status || got.Body["error"] != r.code {
			t.Errorf("%s: %d %s, want %d %s", r.name, got.Status, got.Raw, r.status, r.code)
		}
	}
	if st := s.dbStatus(victim); st != "PENDING" {
		t.Fatalf("the other order is %s, want PENDING", st)
	}
	if n, ev := s.payments(victim), s.events(victim, "order.paid", "payment.refused"); n != 0 || len(ev) != 0 {
		t.Fatalf("the other order has %d payments and events %v, want none", n, ev)
	}
	var sigs int
	if err := s.pg.QueryRow(context.Background(), `SELECT count(*) FROM payment_signatures WHERE signature = ANY($1)`,
		[]string{sig, lowerSig}).Scan(&sigs); err != nil {
		t.Fatal(err)
	}
	if sigs != 2 {
		t.Fatalf("%d of the 2 refused callbacks' signatures recorded", sigs)
	}
	// The shop's own payment of the order, signed for it, still pays it.
	s.wantPaid(s.pay(victim, "pi_victim", 1999, now), victim, "pi_victim")
}

// TestSecurityPaymentCurrencyMismatch: a JPY payment of an EUR order's
// amount is refused 409 PAYMENT_MISMATCH with a payment.refused event to
// refund it from, and pays nothing; its retry answers the same and adds
// nothing; so does an EUR payment of another amount; the right payment
// then pays the order.
func TestSecurityPaymentCurrencyMismatch(t *testing.T) {
	s := startPayStack(t)
	saleID, items := s.createSaleWith(10000, 5) // EUR items of 1999 cents
	order := s.bought(100, saleID, items[0])
	now := time.Now()
	for i := range 2 {
		// The retry is signed a second earlier, so it is not a replay.
		r := s.callback(order, payBodyIn("pi_yen", 1999, "JPY"), paySig(order, now.Add(-time.Duration(i)*time.Second), payBodyIn("pi_yen", 1999, "JPY")), true)
		s.Want(r, 409, "PAYMENT_MISMATCH")
	}
	r := s.callback(order, payBodyIn("pi_cheap", 1, "EUR"), paySig(order, now, payBodyIn("pi_cheap", 1, "EUR")), true)
	s.Want(r, 409, "PAYMENT_MISMATCH")
	if st := s.dbStatus(order); st != "PENDING" {
		t.Fatalf("a mismatched payment changed the order to %s", st)
	}
	want := []orderEvent{{"payment.refused", "PENDING", "pi_yen", "PAYMENT_MISMATCH"}, {"payment.refused", "PENDING", "pi_cheap", "PAYMENT_MISMATCH"}}
	if got := s.events(order, "order.paid", "payment.refused"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events %+v, want %+v", got, want)
	}
	body := payBodyIn("pi_euro", 1999, "EUR")
	s.wantPaid(s.callback(order, body, paySig(order, now, body), true), order, "pi_euro")
}

// TestSecurityShortSecretRefused: FLASHSALE_JWT_SECRET=k (and any secret
// under 32 bytes) fails the start of every role, with an error naming the
// variable, before anything is served.
func TestSecurityShortSecretRefused(t *testing.T) {
	base := wiring.Defaults()
	base.HTTPAddr, base.AdminAddr = "127.0.0.1:0", "127.0.0.1:0"
	rc := testenv.RedisConfig(t)
	base.RedisURL, base.RedisCluster = rc.URL, rc.Cluster
	base.DatabaseURL = testenv.DatabaseURL(t)
	base.KafkaBrokers = testenv.NewKafka(t).Brokers
	base.JWTSecret = apptest.Secret
	short := strings.Repeat("k", wiring.MinSecretBytes-1)
	secrets := []struct {
		name string
		set  func(*wiring.Config)
	}{
		{"FLASHSALE_JWT_SECRET", func(c *wiring.Config) { c.JWTSecret = "k" }},
		{"FLASHSALE_JWT_SECRET", func(c *wiring.Config) { c.JWTSecret = short }},
		{"FLASHSALE_ADMISSION_KEY", func(c *wiring.Config) { c.AdmissionKey = short }},
		{"FLASHSALE_PAYMENT_SECRET", func(c *wiring.Config) { c.PaymentSecret = short }},
		{"FLASHSALE_WEBHOOK_SECRET", func(c *wiring.Config) { c.WebhookURL, c.WebhookSecret = "https://shop.example/hooks", short }},
	}
	roles := map[string]wiring.Roles{
		"gateway": {Gateway: true}, "writer": {Writer: true}, "expiry": {Expiry: true}, "all": wiring.AllRoles,
	}
	for role, r := range roles {
		for _, sc := range secrets {
			cfg := base
			sc.set(&cfg)
			a, err := wiring.Start(context.Background(), cfg, r, slog.New(slog.DiscardHandler))
			if err == nil {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				a.Close(ctx)
				cancel()
				t.Errorf("%s with a %s of %d bytes started", role, sc.name, wiringSecretLen(cfg, sc.name))
				continue
			}
			if !strings.Contains(err.Error(), sc.name) || !strings.Contains(err.Error(), "at least 32") {
				t.Errorf("%s with a short %s: %v, want an error naming it and the minimum", role, sc.name, err)
			}
		}
	}
}

// wiringSecretLen is the length of the named secret of cfg.
func wiringSecretLen(cfg wiring.Config, name string) int {
	switch name {
	case "FLASHSALE_JWT_SECRET":
		return len(cfg.JWTSecret)
	case "FLASHSALE_ADMISSION_KEY":
		return len(cfg.AdmissionKey)
	case "FLASHSALE_PAYMENT_SECRET":
		return len(cfg.PaymentSecret)
	}
	return len(cfg.WebhookSecret)
}
