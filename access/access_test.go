package access

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/sales"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// env is a Store and a Gate on a fresh database, with the sale store
// that creates the sales and moves their versions.
type env struct {
	sales *sales.Store
	store *Store
	gate  *Gate
}

func newEnv(t *testing.T) *env {
	t.Helper()
	rdb := testenv.Redis(t)
	pool := testenv.Postgres(t)
	ss := sales.NewStore(pool, rdb, redisstock.New(rdb), nil)
	st := NewStore(pool, ss)
	return &env{sales: ss, store: st, gate: NewGate(st)}
}

// sale creates a sale with the access rule a.
func (e *env) sale(t *testing.T, a flashsale.SaleAccess) *flashsale.Sale {
	t.Helper()
	s, err := e.sales.Create(context.Background(), flashsale.Sale{Name: "access", StartsAt: time.Date(2026, 12, 1, 18, 0, 0, 0, time.UTC),
		AdmissionRatePerSecond: 10, Access: a, Items: []flashsale.Item{{ProductID: 1, Quantity: 5, PriceCents: 100}}})
	if err != nil {
		t.Fatal(err)
	}
	return &s
}

// reload is the sale as a gateway's cache holds it after a change.
func (e *env) reload(t *testing.T, id int64) *flashsale.Sale {
	t.Helper()
	s, err := e.sales.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return &s
}

func TestParseAllowlist(t *testing.T) {
	for _, tt := range []struct {
		name, in string
		want     string // fmt of the entries; "" for INVALID
		msg      string // part of the INVALID message
	}{
		{"header and default tier", "userId,tier\n7,2\n8\n", "[{7 2} {8 1}]", ""},
		{"no header, spaces, CRLF", "7 , 3\r\n\r\n9\r\n", "[{7 3} {9 1}]", ""},
		{"empty", "", "[]", ""},
		{"not a user", "bob\n", "", "line 1"},
		{"zero user", "0\n", "", "line 1"},
		{"tier out of range", "7,10\n", "", "tier must be 1 to 9"},
		{"three fields", "7,1,x\n", "", "line 1: want userId[,tier]"},
		{"twice", "7\n8\n7,2\n", "", "line 3: user 7 is already on line 1"},
		{"header later", "7\nuserId,tier\n", "", "line 2"},
		{"bad quote", "\"7\n", "", "not CSV"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseAllowlist([]byte(tt.in))
			if tt.want == "" {
				if flashsale.ErrorCode(err) != flashsale.CodeInvalid || !strings.Contains(flashsale.ErrorMessage(err), tt.msg) {
					t.Fatalf("err = %v, want INVALID with %q", err, tt.msg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s := fmt.Sprint(got); s != tt.want && !(tt.want == "[]" && len(got) == 0) {
				t.Errorf("got %s, want %s", s, tt.want)
			}
		})
	}
}

// FuzzParseAllowlist: any upload is entries of valid users and tiers,
// each user once, or INVALID.
func FuzzParseAllowlist(f *testing.F) {
	for _, s := range []string{"userId,tier\n1,1\n2\n", "1,9\n", "\"1\",\"2\"\n", "1,1,1\n", "\xff", "a\"b\n", "1\n1\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := ParseAllowlist(b)
		if err != nil {
			if flashsale.ErrorCode(err) != flashsale.CodeInvalid {
				t.Fatalf("error code %s, want INVALID", flashsale.ErrorCode(err))
			}
			return
		}
		seen := map[int64]bool{}
		for _, e := range got {
			if e.UserID < 1 || e.Tier < 1 || e.Tier > flashsale.MaxTier || seen[e.UserID] {
				t.Fatalf("accepted entry %+v of %q", e, b)
			}
			seen[e.UserID] = true
		}
	})
}

func TestNewCode(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		c, err := newCode()
		if err != nil {
			t.Fatal(err)
		}
		if len(c) != GeneratedLen || strings.Trim(c, codeAlphabet) != "" || !ValidCode(c) || seen[c] {
			t.Fatalf("code %q: want %d fresh characters of %s", c, GeneratedLen, codeAlphabet)
		}
		seen[c] = true
	}
}

// TestGatePlainOpen: a plain open sale passes without the store (a nil
// one would panic on any I/O).
func TestGatePlainOpen(t *testing.T) {
	g := NewGate(nil)
	tier, err := g.Check(context.Background(), &flashsale.Sale{ID: 1}, flashsale.Principal{UserID: 1, Tier: 3}, "ANYCODE", time.Now())
	if err != nil || tier != 0 {
		t.Fatalf("Check = %d, %v; want 0, nil", tier, err)
	}
}

// TestGateRules: the refusals and tiers of each rule, without a store
// where the rule needs none.
func TestGateRules(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 18, 0, 0, 0, time.UTC)
	members := flashsale.SaleAccess{PublicFrom: t0.Add(time.Hour), Tiers: []flashsale.AccessTier{{Tier: 1, JoinFrom: t0}}}
	g := NewGate(nil)
	for _, tt := range []struct {
		name string
		tier int
		now  time.Time
		want flashsale.Code
	}{
		{"member too early", 1, t0.Add(-time.Second), flashsale.CodeNotYet},
		{"member at the start", 1, t0, ""},
		{"tier 2, unlisted, joins with the public", 2, t0, flashsale.CodeNotYet},
		{"no tier before public", 0, t0.Add(time.Minute), flashsale.CodeNotYet},
		{"no tier at public", 0, t0.Add(time.Hour), ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := g.Check(context.Background(), &flashsale.Sale{ID: 1, Access: members}, flashsale.Principal{UserID: 5, Tier: tt.tier}, "", tt.now)
			if got := flashsale.ErrorCode(err); got != tt.want {
				t.Fatalf("code %q (%v), want %q", got, err, tt.want)
			}
		})
	}
}

// TestStoreCodes: redemption binds a code once per user, counts every
// user, never passes the limit under concurrent redemptions, leaves a
// code unspent on a NOT_YET, and a limit is never set below the uses.
func TestStoreCodes(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	t0 := time.Date(2026, 12, 1, 18, 0, 0, 0, time.UTC)
	sale := e.sale(t, flashsale.SaleAccess{Rule: flashsale.AccessCodes, PublicFrom: t0.Add(2 * time.Hour),
		Tiers: []flashsale.AccessTier{{Tier: 1, JoinFrom: t0}, {Tier: 2, JoinFrom: t0.Add(time.Hour)}}})
	if _, err := e.store.SetCodes(ctx, sale.ID, []string{"multi"}, 5, 2, "op"); err != nil {
		t.Fatal(err)
	}
	// Too early for tier 2: refused, nothing spent.
	if _, err := e.gate.Check(ctx, sale, flashsale.Principal{UserID: 1}, "MULTI", t0); flashsale.ErrorCode(err) != flashsale.CodeNotYet {
		t.Fatalf("tier 2 code before its start: %v, want NOT_YET", err)
	}
	now := t0.Add(time.Hour)
	var wg sync.WaitGroup
	errs := make([]error, 20)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Users 1..10 twice each, at once, on two gateways.
			g := e.gate
			if i%2 == 1 {
				g = NewGate(e.store)
			}
			_, errs[i] = g.Check(ctx, sale, flashsale.Principal{UserID: int64(1 + i/2)}, "multi", now)
		}()
	}
	wg.Wait()
	codes, err := e.store.Codes(ctx, sale.ID)
	if err != nil {
		t.Fatal(err)
	}
	users := map[int64]bool{}
	for i, err := range errs {
		switch flashsale.ErrorCode(err) {
		case "":
			users[int64(1+i/2)] = true
		case flashsale.CodeCodeUsed:
		default:
			t.Fatalf("redemption: %v", err)
		}
	}
	if len(users) != 5 || len(codes) != 1 || codes[0].Used != 5 {
		t.Fatalf("users in %v, codes %+v; want 5 users and used 5 of 5", users, codes)
	}
	// A bound user comes back without the code, on a gateway that never
	// saw them.
	for u := range users {
		tier, err := NewGate(e.store).Check(ctx, sale, flashsale.Principal{UserID: u}, "", now)
		if err != nil || tier != 2 {
			t.Fatalf("bound user %d again: %d, %v; want tier 2", u, tier, err)
		}
	}
	if _, err := e.store.SetCodes(ctx, sale.ID, []string{"MULTI"}, 4, 2, "op"); flashsale.ErrorCode(err) != flashsale.CodeInvalid {
		t.Fatalf("a limit below the uses: %v, want INVALID", err)
	}
	if _, err := e.store.GenerateCodes(ctx, 999999, 1, 1, "op"); flashsale.ErrorCode(err) != flashsale.CodeNotFound {
		t.Fatalf("codes of no sale: %v, want NOT_FOUND", err)
	}
}

// TestStoreAllowlist: an upload moves the sale's version, and a Gate
// that cached the old list reads the new one at the new version.
func TestStoreAllowlist(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	sale := e.sale(t, flashsale.SaleAccess{Rule: flashsale.AccessAllowlist})
	check := func(s *flashsale.Sale, user int64) (int, flashsale.Code) {
		tier, err := e.gate.Check(ctx, s, flashsale.Principal{UserID: user}, "", time.Now())
		return tier, flashsale.ErrorCode(err)
	}
	if _, c := check(sale, 7); c != flashsale.CodeNotInvited {
		t.Fatalf("before any upload: %s, want NOT_INVITED", c)
	}
	if _, err := e.store.PutAllowlist(ctx, sale.ID, sale.Version+5, nil, false, "op"); flashsale.ErrorCode(err) != flashsale.CodeVersionConflict {
		t.Fatalf("stale If-Match: %v, want VERSION_CONFLICT", err)
	}
	n, err := e.store.PutAllowlist(ctx, sale.ID, sale.Version, []Entry{{UserID: 7, Tier: 2}}, false, "op")
	if err != nil || n != 1 {
		t.Fatalf("PutAllowlist = %d, %v", n, err)
	}
	s2 := e.reload(t, sale.ID)
	if s2.Version != sale.Version+1 {
		t.Fatalf("version %d, want %d", s2.Version, sale.Version+1)
	}
	if tier, c := check(s2, 7); c != "" || tier != 2 {
		t.Fatalf("listed user: %d, %s; want tier 2", tier, c)
	}
	if n, err := e.store.PutAllowlist(ctx, sale.ID, 0, []Entry{{UserID: 8, Tier: 1}}, true, "op"); err != nil || n != 2 {
		t.Fatalf("append = %d, %v; want 2", n, err)
	}
	s3 := e.reload(t, sale.ID)
	if tier, c := check(s3, 8); c != "" || tier != 1 {
		t.Fatalf("appended user: %d, %s; want tier 1", tier, c)
	}
	if _, err := e.store.PutAllowlist(ctx, 999999, 0, nil, false, "op"); flashsale.ErrorCode(err) != flashsale.CodeNotFound {
		t.Fatalf("list of no sale: %v, want NOT_FOUND", err)
	}
}
