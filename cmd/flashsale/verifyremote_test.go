package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/auth"
	"github.com/flashsale/flashsale/internal/adapter/redisconn"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring"
	"github.com/flashsale/flashsale/internal/wiring/apptest"
	"github.com/flashsale/flashsale/waitroom"
)

// TestVerifyDrawURL: shoppers pre-queue through the real gateway; after
// opening the public draw record, fetched by verify-draw --url without
// Redis, gives every shopper the place the room admitted them at; the
// endpoint refuses before the draw and for unknown sales, and is
// cacheable.
func TestVerifyDrawURL(t *testing.T) {
	s := apptest.Start(t)
	ctx := context.Background()
	opens := time.Now().Add(2 * time.Second)
	sale, err := s.App.CreateSale(ctx, flashsale.Sale{Name: "drawn", StartsAt: opens, AdmissionRatePerSecond: 1000, Allocation: flashsale.AllocationRace,
		Items: []flashsale.Item{{ProductID: 1, Quantity: 100, PriceCents: 100}}})
	if err != nil {
		t.Fatal(err)
	}
	path := "/api/flash-sales/sales/" + itoa(sale.ID)
	const pre = 25
	secrets := map[int64]string{}
	for u := int64(1); u <= pre; u++ {
		r := s.Do("POST", path+"/queue", s.Token(u, false), nil)
		s.Want(r, 200, "")
		if r.Body["state"] != "PREQUEUE" {
			t.Fatalf("user %d joined as %v, want PREQUEUE (the test must join before opening)", u, r.Body["state"])
		}
		secrets[u], _ = r.Body["drawSecret"].(string)
		if len(secrets[u]) != 32 {
			t.Fatalf("user %d: join status without a drawSecret: %s", u, r.Raw)
		}
	}
	s.Want(s.Do("GET", path+"/draw", "", nil), 409, "NOT_DRAWN")
	s.Want(s.Do("GET", "/api/flash-sales/sales/987654/draw", "", nil), 404, "NOT_FOUND")
	s.Want(s.Do("GET", "/api/flash-sales/sales/abc/draw", "", nil), 400, "INVALID")
	if code, out, _ := runCmd(t, nil, "verify-draw", "--url", s.App.PublicURL+path+"/draw"); code == 0 {
		t.Fatalf("verify-draw before the draw: exit 0: %s", out)
	}

	// Every shopper polls until admitted: the room records each place.
	pollAdmitted(t, s, path, pre)
	// The room's admitted places, checked against its records in Redis.
	rep, admittedAt := roomDraw(ctx, t, s, &sale)
	if rep.Checked != pre || len(rep.Order) != pre {
		t.Fatalf("VerifyDraw checked %d of %d admissions, %d places", rep.Checked, pre, len(rep.Order))
	}

	r := s.Do("GET", path+"/draw", "", nil)
	s.Want(r, 200, "")
	if cc := r.Header.Get("Cache-Control"); !strings.Contains(cc, "public") || !strings.Contains(cc, "immutable") {
		t.Fatalf("Cache-Control %q", cc)
	}
	etag := r.Header.Get("ETag")
	if etag == "" {
		t.Fatal("no ETag")
	}
	if r2 := s.Do("GET", path+"/draw", "", nil, "If-None-Match", etag); r2.Status != 304 {
		t.Fatalf("If-None-Match: status %d", r2.Status)
	}
	raw := r.Raw

	drawURL := s.App.PublicURL + path + "/draw"
	code, out, errOut := runCmd(t, nil, "verify-draw", "--url", drawURL, "--list", "--commitment", sale.ShuffleCommitment)
	if code != 0 || !strings.Contains(out, "OK:") {
		t.Fatalf("verify-draw --url: exit %d\n%s%s", code, out, errOut)
	}
	// The listing: place p holds the ticket of the user admitted at p.
	ticketOf := map[int64]int64{}
	for i, u := range rep.PreQueue {
		ticketOf[u] = int64(i)
	}
	line := regexp.MustCompile(`place (\d+) ticket (\d+) member`)
	listed := line.FindAllStringSubmatch(out, -1)
	if len(listed) != pre {
		t.Fatalf("%d places listed, want %d:\n%s", len(listed), pre, out)
	}
	for _, m := range listed {
		place, _ := strconv.Atoi(m[1])
		ticket, _ := strconv.ParseInt(m[2], 10, 64)
		if u := rep.Order[place]; ticketOf[u] != ticket {
			t.Fatalf("place %d: verify-draw lists ticket %d, the room admitted user %d (ticket %d) there", place, ticket, u, ticketOf[u])
		}
	}
	// Each shopper finds their own place by user id and secret, with a
	// base URL.
	userLine := regexp.MustCompile(`user \d+ +ticket \d+, place (\d+)`)
	for u := int64(1); u <= pre; u++ {
		code, out, errOut := runCmd(t, nil, "verify-draw", "--url", s.App.PublicURL, "--sale", itoa(sale.ID), "--user", itoa(u), "--secret", secrets[u])
		m := userLine.FindStringSubmatch(out)
		if code != 0 || m == nil {
			t.Fatalf("verify-draw --user %d: exit %d\n%s%s", u, code, out, errOut)
		}
		if got, _ := strconv.Atoi(m[1]); got != admittedAt[u] {
			t.Fatalf("user %d: verify-draw says place %d, admitted at %d", u, got, admittedAt[u])
		}
	}
	if code, out, _ := runCmd(t, nil, "verify-draw", "--url", drawURL, "--user", "999", "--secret", secrets[1]); code == 0 {
		t.Fatalf("a user not in the pre-queue: exit 0: %s", out)
	}
	// The user id alone finds nothing: it needs the secret, and another
	// user's secret does not do.
	if code, out, _ := runCmd(t, nil, "verify-draw", "--url", drawURL, "--user", "1"); code == 0 {
		t.Fatalf("--user without --secret: exit 0: %s", out)
	}
	if code, out, _ := runCmd(t, nil, "verify-draw", "--url", drawURL, "--user", "1", "--secret", secrets[2]); code == 0 {
		t.Fatalf("--user 1 with user 2's secret: exit 0: %s", out)
	}
	if code, out, _ := runCmd(t, nil, "verify-draw", "--url", drawURL, "--user", "1", "--secret", "xyz"); code == 0 {
		t.Fatalf("a malformed --secret: exit 0: %s", out)
	}
	if code, out, _ := runCmd(t, nil, "verify-draw", "--url", drawURL, "--commitment", strings.Repeat("0", 64)); code == 0 {
		t.Fatalf("another noted commitment: exit 0: %s", out)
	}

	// A tampered record, served by a test server with the real sale page.
	var rec map[string]any
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	page := s.Do("GET", path, "", nil).Raw
	other, err := s.App.CreateSale(ctx, flashsale.Sale{Name: "other", StartsAt: time.Now(), AdmissionRatePerSecond: 1, Allocation: flashsale.AllocationRace,
		Items: []flashsale.Item{{ProductID: 1, Quantity: 1, PriceCents: 100}}})
	if err != nil {
		t.Fatal(err)
	}
	members := rec["members"].([]any)
	tampers := map[string]func(m map[string]any){
		"seed changed": func(m map[string]any) { m["seed"] = other.SeedHex() },
		"seed and commitment replaced": func(m map[string]any) {
			m["seed"], m["commitment"] = other.SeedHex(), other.ShuffleCommitment
		},
		"a member dropped": func(m map[string]any) { m["members"] = members[1:] },
		"a member twice": func(m map[string]any) {
			ms := append([]any(nil), members...)
			ms[1] = ms[0]
			m["members"] = ms
		},
		"another sale": func(m map[string]any) { m["saleId"] = sale.ID + 1 },
	}
	for name, tamper := range tampers {
		t.Run(name, func(t *testing.T) {
			m := map[string]any{}
			for k, v := range rec {
				m[k] = v
			}
			tamper(m)
			body, _ := json.Marshal(m)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				switch r.URL.Path {
				case path:
					_, _ = w.Write(page)
				case path + "/draw":
					_, _ = w.Write(body)
				default:
					http.NotFound(w, r)
				}
			}))
			defer srv.Close()
			code, out, errOut := runCmd(t, nil, "verify-draw", "--url", srv.URL+path+"/draw")
			if code == 0 {
				t.Fatalf("tampered record verified:\n%s", out)
			}
			if !strings.Contains(out, "MISMATCH") && strings.TrimSpace(errOut) == "" {
				t.Fatalf("exit %d without a reason: %s", code, out)
			}
		})
	}
}

func TestDrawURLs(t *testing.T) {
	tests := []struct {
		raw        string
		sale       int64
		rec, page  string
		id         int64
		shouldFail bool
	}{
		{raw: "https://shop.example/api/flash-sales/sales/7/draw", rec: "https://shop.example/api/flash-sales/sales/7/draw", page: "https://shop.example/api/flash-sales/sales/7", id: 7},
		{raw: "https://shop.example/api/flash-sales/sales/7/draw/?x=1", rec: "https://shop.example/api/flash-sales/sales/7/draw", page: "https://shop.example/api/flash-sales/sales/7", id: 7},
		{raw: "http://127.0.0.1:8080", sale: 9, rec: "http://127.0.0.1:8080/api/flash-sales/sales/9/draw", page: "http://127.0.0.1:8080/api/flash-sales/sales/9", id: 9},
		{raw: "https://cdn.example/shop/", sale: 3, rec: "https://cdn.example/shop/api/flash-sales/sales/3/draw", page: "https://cdn.example/shop/api/flash-sales/sales/3", id: 3},
		{raw: "https://shop.example", shouldFail: true},
		{raw: "https://shop.example/api/flash-sales/sales/7/draw", sale: 8, shouldFail: true},
		{raw: "https://shop.example/api/flash-sales/sales/x/draw", shouldFail: true},
		{raw: "https://shop.example/draw", shouldFail: true},
		{raw: "ftp://shop.example/api/flash-sales/sales/7/draw", shouldFail: true},
		{raw: "shop.example", sale: 1, shouldFail: true},
	}
	for _, tt := range tests {
		rec, page, id, err := drawURLs(tt.raw, tt.sale)
		if (err != nil) != tt.shouldFail {
			t.Errorf("drawURLs(%q, %d): error %v, want failure %v", tt.raw, tt.sale, err, tt.shouldFail)
			continue
		}
		if err == nil && (rec != tt.rec || page != tt.page || id != tt.id) {
			t.Errorf("drawURLs(%q, %d) = %q, %q, %d; want %q, %q, %d", tt.raw, tt.sale, rec, page, id, tt.rec, tt.page, tt.id)
		}
	}
}

// FuzzDrawURLs: any --url either fails or names a positive sale whose
// record URL is the sale page's with /draw.
func FuzzDrawURLs(f *testing.F) {
	f.Add("https://shop.example/api/flash-sales/sales/7/draw", int64(0))
	f.Add("http://127.0.0.1:8080", int64(9))
	f.Add("https://x/sales//draw", int64(-1))
	f.Fuzz(func(t *testing.T, raw string, sale int64) {
		rec, page, id, err := drawURLs(raw, sale)
		if err != nil {
			return
		}
		if id <= 0 || rec != page+"/draw" {
			t.Fatalf("drawURLs(%q, %d) = %q, %q, %d", raw, sale, rec, page, id)
		}
	})
}

// TestVerifyDrawURLByTier: an open sale that draws by tier, its shoppers'
// tiers in trusted token claims (FLASHSALE_JWT_TIER_SIGNERS=secret):
// verify-draw --url reads the version 3 record, prints each tier's block
// of places, lists every place with its tier, and finds each shopper's
// place with their secret: tier 1's in the first block, no tier's last,
// and the room admitted each at that place.
func TestVerifyDrawURLByTier(t *testing.T) {
	s := apptest.Start(t, func(c *wiring.Config) { c.JWTTierSigners = []string{auth.SignerSecret} })
	ctx := context.Background()
	opens := time.Now().Add(2 * time.Second)
	sale, err := s.App.CreateSale(ctx, flashsale.Sale{Name: "members first", StartsAt: opens, AdmissionRatePerSecond: 1000,
		Allocation: flashsale.AllocationRace, Access: flashsale.SaleAccess{DrawByTier: true},
		Items: []flashsale.Item{{ProductID: 1, Quantity: 100, PriceCents: 100}}})
	if err != nil {
		t.Fatal(err)
	}
	path := "/api/flash-sales/sales/" + itoa(sale.ID)
	tierOf := func(u int64) int { return [3]int{0, 1, 2}[u%3] } // 3, 6, 9 ... no tier
	const pre = 12
	secrets := map[int64]string{}
	for u := int64(1); u <= pre; u++ {
		tok, err := auth.MintTier(apptest.Secret, u, false, "", tierOf(u), time.Hour, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		r := s.Do("POST", path+"/queue", tok, nil)
		s.Want(r, 200, "")
		if r.Body["state"] != "PREQUEUE" {
			t.Fatalf("user %d joined as %v, want PREQUEUE", u, r.Body["state"])
		}
		secrets[u] = r.Body["drawSecret"].(string)
	}
	pollAdmitted(t, s, path, pre)
	rep, admittedAt := roomDraw(ctx, t, s, &sale)
	if !rep.Tiered || len(rep.Order) != pre {
		t.Fatalf("VerifyDraw: tiered %v, %d places; want a draw by tier of %d", rep.Tiered, len(rep.Order), pre)
	}
	testenv.EventuallyF(t, func() string { return "the draw record" }, 20*time.Second, func() bool {
		return s.Do("GET", path+"/draw", "", nil).Status == 200
	})

	drawURL := s.App.PublicURL + path + "/draw"
	code, out, errOut := runCmd(t, nil, "verify-draw", "--url", drawURL, "--list")
	if code != 0 || !strings.Contains(out, "OK:") {
		t.Fatalf("verify-draw --url: exit %d\n%s%s", code, out, errOut)
	}
	if want := "by tier     tier 1: 4 places 0-3, tier 2: 4 places 4-7, no tier: 4 places 8-11"; !strings.Contains(out, want) {
		t.Fatalf("verify-draw does not print %q:\n%s", want, out)
	}
	listed := regexp.MustCompile(`place (\d+) ticket \d+ member [0-9a-f]+ (tier \d|no tier)`).FindAllStringSubmatch(out, -1)
	if len(listed) != pre {
		t.Fatalf("%d places listed with a tier, want %d:\n%s", len(listed), pre, out)
	}
	for _, m := range listed {
		place, _ := strconv.Atoi(m[1])
		want := "tier 1"
		switch {
		case place >= 8:
			want = "no tier"
		case place >= 4:
			want = "tier 2"
		}
		if m[2] != want {
			t.Fatalf("place %d listed as %s, want %s:\n%s", place, m[2], want, out)
		}
	}
	userLine := regexp.MustCompile(`user \d+ +ticket \d+, place (\d+) \(0-based; member [0-9a-f]+ (tier \d|no tier)\)`)
	for u := int64(1); u <= pre; u++ {
		code, out, errOut := runCmd(t, nil, "verify-draw", "--url", s.App.PublicURL, "--sale", itoa(sale.ID), "--user", itoa(u), "--secret", secrets[u])
		m := userLine.FindStringSubmatch(out)
		if code != 0 || m == nil {
			t.Fatalf("user %d: exit %d\n%s%s", u, code, out, errOut)
		}
		place, _ := strconv.ParseInt(m[1], 10, 64)
		if place != int64(admittedAt[u]) {
			t.Fatalf("user %d: verify-draw gives place %d, the room admitted them at %d", u, place, admittedAt[u])
		}
		wantTier := map[int]string{0: "no tier", 1: "tier 1", 2: "tier 2"}[tierOf(u)]
		if m[2] != wantTier {
			t.Fatalf("user %d: verify-draw says %s, they joined with %s", u, m[2], wantTier)
		}
	}
}

// pollAdmitted polls the queue status of users 1..n of the sale at path
// until each is admitted: the room records each admission's place.
func pollAdmitted(t *testing.T, s *apptest.Stack, path string, n int64) {
	t.Helper()
	for u := int64(1); u <= n; u++ {
		var r apptest.Resp
		testenv.EventuallyF(t, func() string { return fmt.Sprintf("user %d to be admitted (last: %s)", u, r.Raw) }, 30*time.Second, func() bool {
			r = s.Do("GET", path+"/queue", s.Token(u, false), nil)
			s.Want(r, 200, "")
			return r.Body["admissionToken"] != nil
		})
	}
}

// roomDraw checks the sale's draw against the room's admission records in
// Redis (waitroom.VerifyDraw) and returns its report and each user's
// admitted place.
func roomDraw(ctx context.Context, t *testing.T, s *apptest.Stack, sale *flashsale.Sale) (waitroom.DrawReport, map[int64]int) {
	t.Helper()
	rdb, err := redisconn.Open(ctx, s.Config.Redis())
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	rep, err := waitroom.VerifyDraw(ctx, rdb, sale)
	if err != nil || !rep.OK {
		t.Fatalf("VerifyDraw: %+v, %v", rep, err)
	}
	placed := make(map[int64]int, len(rep.Order))
	for place, u := range rep.Order {
		placed[u] = place
	}
	return rep, placed
}
