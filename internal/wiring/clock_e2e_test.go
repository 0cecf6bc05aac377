package wiring_test

import (
	"context"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/wiring"
)

// skewedGateways starts two gateways on the same Redis, PostgreSQL and
// Kafka whose own clocks run off by the given skews.
func skewedGateways(t *testing.T, skewA, skewB time.Duration) (*stack, *stack) {
	t.Helper()
	var shared wiring.Config
	a := startStack(t, func(c *wiring.Config) { c.ClockSkew = skewA; shared = *c })
	b := startStack(t, func(c *wiring.Config) {
		c.RedisURL, c.RedisCluster, c.DatabaseURL, c.KafkaBrokers = shared.RedisURL, shared.RedisCluster, shared.DatabaseURL, shared.KafkaBrokers
		c.ClockSkew = skewB
	})
	return a, b
}

// jumpClock is a fleet clock a test injects (wiring.Config.Clock) and
// moves forward: it runs with the machine clock and jumps by Advance, so
// a sale's timeline moves without the test waiting for it.
type jumpClock struct{ ahead atomic.Int64 }

func (c *jumpClock) Now() time.Time { return time.Now().Add(time.Duration(c.ahead.Load())) }

// AdvanceTo jumps the clock forward to at (never back).
func (c *jumpClock) AdvanceTo(at time.Time) {
	if d := at.Sub(c.Now()); d > 0 {
		c.ahead.Add(int64(d))
	}
}

// waitUntil blocks until the machine clock reaches at: for tests about
// true instants, which no injected clock stands for (the fleet clock is
// Redis TIME, or another process reads the time).
func waitUntil(at time.Time) {
	if d := time.Until(at); d > 0 {
		<-time.After(d)
	}
}

// TestClockOneForTheFleet: two gateways whose clocks run 2 s fast and 2 s
// slow read the fleet's clock (Redis TIME, which here is the machine's):
// both say so in /readyz and a metric, both serve the same countdown, the
// pre-queue is open until the true opening on the fast one and closed
// after it on the slow one, and neither reserves a unit before the true
// opening.
func TestClockOneForTheFleet(t *testing.T) {
	t.Parallel() // waits on real windows (TestMain)
	const skew = 2 * time.Second
	fast, slow := skewedGateways(t, skew, -skew)
	for _, g := range []struct {
		s    *stack
		name string
		note string
		off  float64
	}{{fast, "fast", "2s ahead of Redis TIME", -2}, {slow, "slow", "2s behind Redis TIME", 2}} {
		r, err := http.Get(g.s.App.AdminURL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != 200 || !strings.HasPrefix(string(body), "ready\n") || !strings.Contains(string(body), g.note) {
			t.Errorf("%s gateway /readyz: %d %q; want 200, ready, and a note %q", g.name, r.StatusCode, body, g.note)
		}
		if v := metricValue(t, g.s.App.AdminURL, "flashsale_clock_offset_seconds"); math.Abs(v-g.off) > 0.1 {
			t.Errorf("%s gateway flashsale_clock_offset_seconds %v, want about %v", g.name, v, g.off)
		}
	}

	opening := time.Now().Add(4 * time.Second).Truncate(time.Second)
	sale, err := fast.App.CreateSale(context.Background(), flashsale.Sale{Name: "one clock", StartsAt: opening, AdmissionRatePerSecond: 1000, Allocation: flashsale.AllocationRace,
		Items: []flashsale.Item{{ProductID: 1, Quantity: 100, PriceCents: 100}}})
	if err != nil {
		t.Fatal(err)
	}
	item := sale.Items[0].ID
	salePath := "/api/flash-sales/sales/" + strconv.FormatInt(sale.ID, 10)
	waitFor(t, "both gateways know the sale", func() bool {
		return fast.Do("GET", salePath, "", nil).Status == 200 && slow.Do("GET", salePath, "", nil).Status == 200
	})

	// The same countdown: both gateways' serverTimeMs is the true time.
	for _, g := range []*stack{fast, slow} {
		sent := time.Now()
		r := g.Do("GET", salePath, "", nil)
		got := time.UnixMilli(int64(r.Body["serverTimeMs"].(float64)))
		if got.Before(sent.Add(-50*time.Millisecond)) || got.After(time.Now().Add(50*time.Millisecond)) {
			t.Errorf("serverTimeMs %s, not within the request (sent %s)", got.Format(time.StampMilli), sent.Format(time.StampMilli))
		}
	}

	// Before the true opening, on the fast gateway (which reads the
	// opening 2 s early from its own clock): the pre-queue is open.
	waitUntil(opening.Add(-1500 * time.Millisecond))
	j := fast.Do("POST", salePath+"/queue", fast.Token(1, false), nil)
	fast.Want(j, 200, "")
	if j.Body["state"] != "PREQUEUE" {
		t.Errorf("a join 1.5 s before the opening on the fast gateway: state %v, want PREQUEUE", j.Body["state"])
	}

	// Purchases from 1 s before the opening to 1.5 s after, alternating
	// gateways, each by a new user with an admission token that has no
	// not-before: only the sale's opening can refuse them.
	type attempt struct {
		gw            string
		sent, arrived time.Time
		status        int
		code          string
	}
	var tries []attempt
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	waitUntil(opening.Add(-time.Second))
	for user := int64(1000); time.Now().Before(opening.Add(1500 * time.Millisecond)); user++ {
		g, name := fast, "fast"
		if user%2 == 1 {
			g, name = slow, "slow"
		}
		sent := time.Now()
		r := g.purchase(user, item, g.App.SignAdmission(user, sale.ID, time.Minute))
		code, _ := r.Body["error"].(string)
		if msg, _ := r.Body["message"].(string); msg != "" {
			code += ": " + msg
		}
		tries = append(tries, attempt{name, sent, time.Now(), r.Status, code})
		<-tick.C
	}
	early, reserved := 0, map[string]int{}
	for _, a := range tries {
		switch {
		case a.status == 202 && a.arrived.Before(opening):
			t.Errorf("%s gateway reserved for a request answered %s before the opening", a.gw, opening.Sub(a.arrived))
		case a.status == 202:
			reserved[a.gw]++
		case a.sent.After(opening.Add(100 * time.Millisecond)):
			t.Errorf("%s gateway: status %d %s for a purchase sent %s after the opening, want 202", a.gw, a.status, a.code, a.sent.Sub(opening))
		case a.status == 403 && a.code == "NOT_ADMITTED: the sale is not open":
			early++
		default:
			t.Errorf("%s gateway: status %d %s before the opening, want 403 NOT_ADMITTED: the sale is not open", a.gw, a.status, a.code)
		}
	}
	if early < 10 || reserved["fast"] == 0 || reserved["slow"] == 0 {
		t.Errorf("%d purchases refused before the opening, reserved after it %v: want both sides of the opening on both gateways", early, reserved)
	}

	// After the true opening, on the slow gateway (whose own clock still
	// reads the pre-queue open): a join is not in the pre-queue.
	j = slow.Do("POST", salePath+"/queue", slow.Token(2, false), nil)
	slow.Want(j, 200, "")
	if j.Body["state"] == "PREQUEUE" {
		t.Errorf("a join %s after the opening on the slow gateway: state PREQUEUE, want the pre-queue closed", time.Since(opening).Round(time.Millisecond))
	}
}
