package wiring_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/csv"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"

	"github.com/flashsale/flashsale/auth"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring"
	"github.com/flashsale/flashsale/internal/wiring/apptest"
)

// createAccessSale creates a sale opening in an hour (its shoppers join
// the pre-queue) with the given access rule.
func createAccessSale(t *testing.T, s *apptest.Stack, now time.Time, access map[string]any) int64 {
	t.Helper()
	r := s.Do("POST", "/api/admin/sales", s.Token(1, true), map[string]any{
		"name": "access", "startsAt": now.Add(time.Hour).UTC().Format(time.RFC3339), "admissionRatePerSecond": 100,
		"access": access, "items": []map[string]any{{"productId": 501, "quantity": 10, "priceCents": 1999}},
	})
	s.Want(r, 201, "")
	return int64(r.Body["id"].(float64))
}

// accessJoin joins over the WebSocket with msg's fields beside the join and
// returns the first message: a status, or an error (then the close
// status too).
func accessJoin(t *testing.T, s *apptest.Stack, saleID int64, token string, extra map[string]any) (map[string]any, websocket.StatusCode) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	url := strings.Replace(s.App.PublicURL, "http://", "ws://", 1) + fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID)
	c, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.CloseNow()
	m := map[string]any{"type": "join", "accessToken": token}
	for k, v := range extra {
		m[k] = v
	}
	b, _ := json.Marshal(m)
	if err := c.Write(ctx, websocket.MessageText, b); err != nil {
		t.Fatalf("write: %v", err)
	}
	_, data, err := c.Read(ctx)
	if err != nil {
		t.Fatalf("read the join's answer: %v", err)
	}
	var got map[string]any
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatalf("answer %s: %v", data, err)
	}
	if got["type"] != "error" {
		return got, -1
	}
	_, _, err = c.Read(ctx)
	return got, websocket.CloseStatus(err)
}

// wantWSRefused joins over the WebSocket and wants the refusal code and a
// policy-violation close.
func wantWSRefused(t *testing.T, s *apptest.Stack, saleID int64, token string, extra map[string]any, code string) {
	t.Helper()
	got, status := accessJoin(t, s, saleID, token, extra)
	if got["error"] != code || status != websocket.StatusPolicyViolation {
		t.Fatalf("WebSocket join %v: %v, close %d; want error %s, close 1008", extra, got, status, code)
	}
}

// queueJoined is the sale's joined count (the queue's tickets in Redis).
func queueJoined(t *testing.T, s *apptest.Stack, saleID int64) int64 {
	t.Helper()
	r := s.Do("GET", fmt.Sprintf("/api/admin/sales/%d", saleID), s.Token(1, true), nil)
	s.Want(r, 200, "")
	return int64(r.Body["queue"].(map[string]any)["joined"].(float64))
}

// wantNotQueued checks that the user holds no place in the sale.
func wantNotQueued(t *testing.T, s *apptest.Stack, saleID, user int64) {
	t.Helper()
	s.Want(s.Do("GET", fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID), s.Token(user, false), nil), 404, "NOT_FOUND")
}

// TestAccessCodes: a codes sale over both joins. Without a code, with an
// unknown code or another sale's, the join is refused and queues nothing;
// a single-use code serves its first user only, who joins again without
// it and keeps their place; a multi-use code serves its limit of users;
// the codes download as CSV with their uses; the refusals are in the
// report.
func TestAccessCodes(t *testing.T) {
	s := apptest.Start(t)
	op := s.Token(1, true)
	now := time.Now()
	sale := createAccessSale(t, s, now, map[string]any{"rule": "codes"})
	other := createAccessSale(t, s, now, map[string]any{"rule": "codes"})
	queue := fmt.Sprintf("/api/flash-sales/sales/%d/queue", sale)

	gen := s.Do("POST", fmt.Sprintf("/api/admin/sales/%d/codes", sale), op, map[string]any{"count": 3, "tier": 1})
	s.Want(gen, 201, "")
	var codes []string
	for _, c := range gen.Body["codes"].([]any) {
		code := c.(map[string]any)["code"].(string)
		if len(code) < 10 || strings.ContainsAny(code, "01ILO") {
			t.Errorf("generated code %q: want at least 10 characters of the unambiguous alphabet", code)
		}
		codes = append(codes, code)
	}
	og := s.Do("POST", fmt.Sprintf("/api/admin/sales/%d/codes", other), op, map[string]any{"count": 1})
	s.Want(og, 201, "")
	otherCode := og.Body["codes"].([]any)[0].(map[string]any)["code"].(string)
	s.Want(s.Do("POST", fmt.Sprintf("/api/admin/sales/%d/codes", sale), op, map[string]any{"codes": []string{"vip2026"}, "maxUses": 2, "tier": 2}), 201, "")

	// Refused: no code, an unknown code, another sale's code.
	s.Want(s.Do("POST", queue, s.Token(100, false), nil), 403, "NOT_INVITED")
	wantWSRefused(t, s, sale, s.Token(100, false), nil, "NOT_INVITED")
	s.Want(s.Do("POST", queue, s.Token(100, false), map[string]any{"code": "NOSUCHCODE42"}), 403, "CODE_INVALID")
	wantWSRefused(t, s, sale, s.Token(100, false), map[string]any{"code": "NOSUCHCODE42"}, "CODE_INVALID")
	s.Want(s.Do("POST", queue, s.Token(100, false), map[string]any{"code": otherCode}), 403, "CODE_INVALID")
	wantWSRefused(t, s, sale, s.Token(100, false), map[string]any{"code": otherCode}, "CODE_INVALID")
	wantNotQueued(t, s, sale, 100)

	// A single-use code: user A over the WebSocket (lower case typed),
	// then user B refused.
	if got, _ := accessJoin(t, s, sale, s.Token(101, false), map[string]any{"code": strings.ToLower(codes[0])}); got["type"] != "status" {
		t.Fatalf("user A with a fresh code: %v; want a status", got)
	}
	s.Want(s.Do("POST", queue, s.Token(102, false), map[string]any{"code": codes[0]}), 403, "CODE_USED")
	wantWSRefused(t, s, sale, s.Token(102, false), map[string]any{"code": codes[0]}, "CODE_USED")
	wantNotQueued(t, s, sale, 102)
	// A comes back without the code, on either join, and keeps the place;
	// giving the code again spends nothing more.
	first := s.Do("GET", queue, s.Token(101, false), nil)
	s.Want(first, 200, "")
	if got, _ := accessJoin(t, s, sale, s.Token(101, false), nil); got["type"] != "status" {
		t.Fatalf("user A reconnecting without the code: %v; want a status", got)
	}
	again := s.Do("POST", queue, s.Token(101, false), map[string]any{"code": codes[0]})
	s.Want(again, 200, "")
	if again.Body["state"] != first.Body["state"] || again.Body["position"] != first.Body["position"] {
		t.Errorf("user A's place after rejoining: %s; before: %s", again.Raw, first.Raw)
	}

	// The multi-use code: two users, then refused.
	s.Want(s.Do("POST", queue, s.Token(103, false), map[string]any{"code": "VIP2026"}), 200, "")
	if got, _ := accessJoin(t, s, sale, s.Token(104, false), map[string]any{"code": "vip2026"}); got["type"] != "status" {
		t.Fatalf("the multi-use code's second user: %v; want a status", got)
	}
	s.Want(s.Do("POST", queue, s.Token(105, false), map[string]any{"code": "VIP2026"}), 403, "CODE_USED")
	wantNotQueued(t, s, sale, 105)
	if got := queueJoined(t, s, sale); got != 3 {
		t.Errorf("joined = %d, want 3 (users 101, 103, 104)", got)
	}

	// The CSV: every code with its uses.
	r := s.Do("GET", fmt.Sprintf("/api/admin/sales/%d/codes.csv", sale), op, nil)
	s.Want(r, 200, "")
	rows, err := csv.NewReader(strings.NewReader(string(r.Raw))).ReadAll()
	if err != nil {
		t.Fatalf("codes CSV %q: %v", r.Raw, err)
	}
	used := map[string]string{}
	for _, row := range rows[1:] {
		used[row[0]] = row[1] + "," + row[2] + "," + row[3]
	}
	want := map[string]string{codes[0]: "1,1,1", codes[1]: "1,1,0", codes[2]: "1,1,0", "VIP2026": "2,2,2"}
	if fmt.Sprint(rows[0]) != "[code tier maxUses used]" || fmt.Sprint(used) != fmt.Sprint(want) {
		t.Errorf("codes CSV %v; want the header and tier,maxUses,used %v", rows, want)
	}
	// Refusals count in the report under "access" (the room writes its
	// roll-up every few seconds).
	testenv.EventuallyF(t, func() string { return "access refusals in the report" }, 20*time.Second, func() bool {
		rep := s.Do("GET", fmt.Sprintf("/api/admin/sales/%d/report", sale), op, nil)
		s.Want(rep, 200, "")
		n, _ := rep.Body["room"].(map[string]any)["refusals"].(map[string]any)["access"].(float64)
		return n >= 9
	})
}

// TestAccessCodeOnceUnderRace: ten users redeem a single-use code at once
// on two gateways; exactly one gets in.
func TestAccessCodeOnceUnderRace(t *testing.T) {
	var shared wiring.Config
	a := apptest.Start(t, func(c *wiring.Config) { shared = *c })
	b := apptest.Start(t, func(c *wiring.Config) {
		c.RedisURL, c.RedisCluster, c.DatabaseURL, c.KafkaBrokers = shared.RedisURL, shared.RedisCluster, shared.DatabaseURL, shared.KafkaBrokers
	})
	sale := createAccessSale(t, a, time.Now(), map[string]any{"rule": "codes"})
	gen := a.Do("POST", fmt.Sprintf("/api/admin/sales/%d/codes", sale), a.Token(1, true), map[string]any{"count": 1})
	a.Want(gen, 201, "")
	code := gen.Body["codes"].([]any)[0].(map[string]any)["code"].(string)
	var wg sync.WaitGroup
	statuses := make([]int, 10)
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := a
			if i%2 == 1 {
				s = b
			}
			statuses[i] = s.Do("POST", fmt.Sprintf("/api/flash-sales/sales/%d/queue", sale), s.Token(int64(200+i), false), map[string]any{"code": code}).Status
		}()
	}
	wg.Wait()
	ok := 0
	for _, st := range statuses {
		if st == 200 {
			ok++
		}
	}
	if ok != 1 || queueJoined(t, a, sale) != 1 {
		t.Errorf("statuses %v, joined %d; want one 200 and one joined", statuses, queueJoined(t, a, sale))
	}
}

// tierKey writes a fresh ECDSA key's public half as PEM and returns the
// private key and the file.
func tierKey(t *testing.T) (*ecdsa.PrivateKey, string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "idp.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return k, path
}

// idpToken is a token of the shop's identity provider with a tier claim.
func idpToken(t *testing.T, k *ecdsa.PrivateKey, user int64, tier int) string {
	t.Helper()
	tok, err := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{
		"sub": strconv.FormatInt(user, 10), "tier": tier,
		"iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix(),
	}).SignedString(k)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestAccessAllowlist: an allowlist sale lets in the users of the CSV
// upload and shoppers with a tier from the trusted identity provider; an
// unlisted user and a tier claim under the HS256 secret, which the
// stack does not trust with tiers, are refused and queue nothing. A bad
// upload changes nothing; the list downloads as it was uploaded.
func TestAccessAllowlist(t *testing.T) {
	idp, pemFile := tierKey(t)
	s := apptest.Start(t, func(c *wiring.Config) {
		c.JWTPublicKeys = []string{pemFile}
		c.JWTTierSigners = []string{auth.SignerPublicKeys}
	})
	op := s.Token(1, true)
	sale := createAccessSale(t, s, time.Now(), map[string]any{"rule": "allowlist"})
	list := fmt.Sprintf("/api/admin/sales/%d/allowlist", sale)
	queue := fmt.Sprintf("/api/flash-sales/sales/%d/queue", sale)

	// Wrong uploads: nothing changes.
	for _, bad := range []string{"userId,tier\n300,1\n300,2\n", "300,10\n", "alice\n", "300,1,x\n"} {
		r := s.Do("PUT", list, op, bad, "Content-Type", "text/csv")
		s.Want(r, 400, "INVALID")
	}
	put := s.Do("PUT", list, op, "userId,tier\n300,1\n301\n", "Content-Type", "text/csv")
	s.Want(put, 200, "")
	if put.Body["users"] != 2.0 || put.Header.Get("ETag") == "" {
		t.Errorf("upload answer %s (ETag %q); want 2 users and the new version", put.Raw, put.Header.Get("ETag"))
	}
	got := s.Do("GET", list, op, nil)
	s.Want(got, 200, "")
	if string(got.Raw) != "userId,tier\n300,1\n301,1\n" {
		t.Errorf("allowlist CSV %q", got.Raw)
	}

	s.Want(s.Do("POST", queue, s.Token(300, false), nil), 200, "")
	if m, _ := accessJoin(t, s, sale, s.Token(301, false), nil); m["type"] != "status" {
		t.Fatalf("listed user 301: %v; want a status", m)
	}
	s.Want(s.Do("POST", queue, s.Token(302, false), nil), 403, "NOT_INVITED")
	wantWSRefused(t, s, sale, s.Token(302, false), nil, "NOT_INVITED")
	// A trusted tier claim joins; the same claim under the secret is
	// forged as far as tiers go.
	s.Want(s.Do("POST", queue, idpToken(t, idp, 303, 1), nil), 200, "")
	forged, err := auth.MintTier(apptest.Secret, 304, false, "", 1, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	s.Want(s.Do("POST", queue, forged, nil), 403, "NOT_INVITED")
	wantWSRefused(t, s, sale, forged, nil, "NOT_INVITED")
	wantNotQueued(t, s, sale, 302)
	wantNotQueued(t, s, sale, 304)

	// Replacing the list takes effect at once: 302 in, 300 out (300 keeps
	// the place it has).
	s.Want(s.Do("PUT", list, op, "302,2\n", "Content-Type", "text/csv"), 200, "")
	s.Want(s.Do("POST", queue, s.Token(302, false), nil), 200, "")
	s.Want(s.Do("POST", queue, s.Token(305, false), nil), 403, "NOT_INVITED")
	if got := queueJoined(t, s, sale); got != 4 {
		t.Errorf("joined = %d, want 4 (300, 301, 303, 302)", got)
	}
}

// TestAccessMembersHour: an open sale whose tier 1 joins from one time
// and everyone else from a later one. On the stack's fleet clock, a tier
// 1 shopper is refused before their start and joins from it; a shopper of
// no tier is refused NOT_YET until publicFrom and joins after.
func TestAccessMembersHour(t *testing.T) {
	var clock jumpClock
	s := apptest.Start(t, func(c *wiring.Config) {
		c.Clock = clock.Now
		c.JWTTierSigners = []string{auth.SignerSecret}
	})
	now := clock.Now()
	members, public := now.Add(5*time.Minute).Truncate(time.Second).UTC(), now.Add(10*time.Minute).Truncate(time.Second).UTC()
	op := s.Token(1, true)
	// The tiers out of order, or public before the members: INVALID.
	for _, bad := range []map[string]any{
		{"rule": "open", "publicFrom": members.Format(time.RFC3339), "tiers": []map[string]any{{"tier": 1, "joinFrom": public.Format(time.RFC3339)}}},
		{"rule": "open", "tiers": []map[string]any{{"tier": 2}, {"tier": 1}}},
		{"rule": "invite"},
	} {
		r := s.Do("POST", "/api/admin/sales", op, map[string]any{
			"name": "bad", "startsAt": now.Add(time.Hour).UTC().Format(time.RFC3339), "admissionRatePerSecond": 100,
			"access": bad, "items": []map[string]any{{"productId": 501, "quantity": 10, "priceCents": 1999}},
		})
		s.Want(r, 400, "INVALID")
	}
	sale := createAccessSale(t, s, now, map[string]any{"rule": "open", "publicFrom": public.Format(time.RFC3339),
		"tiers": []map[string]any{{"tier": 1, "joinFrom": members.Format(time.RFC3339)}}})
	pub := s.Do("GET", fmt.Sprintf("/api/flash-sales/sales/%d", sale), "", nil)
	s.Want(pub, 200, "")
	if a, _ := pub.Body["access"].(map[string]any); a["rule"] != "open" || a["publicFrom"] != public.Format(time.RFC3339) {
		t.Errorf("public sale access %v", pub.Body["access"])
	}
	queue := fmt.Sprintf("/api/flash-sales/sales/%d/queue", sale)
	member, err := auth.MintTier(apptest.Secret, 400, false, "", 1, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	r := s.Do("POST", queue, member, nil)
	s.Want(r, 403, "NOT_YET")
	if msg, _ := r.Body["message"].(string); !strings.Contains(msg, members.UTC().Format(time.RFC3339)) {
		t.Errorf("NOT_YET message %q; want the tier's start", msg)
	}
	clock.AdvanceTo(members)
	s.Want(s.Do("POST", queue, member, nil), 200, "")
	r = s.Do("POST", queue, s.Token(401, false), nil)
	s.Want(r, 403, "NOT_YET")
	if msg, _ := r.Body["message"].(string); !strings.Contains(msg, public.UTC().Format(time.RFC3339)) {
		t.Errorf("NOT_YET message %q; want the public start", msg)
	}
	wantWSRefused(t, s, sale, s.Token(401, false), nil, "NOT_YET")
	wantNotQueued(t, s, sale, 401)
	clock.AdvanceTo(public)
	s.Want(s.Do("POST", queue, s.Token(401, false), nil), 200, "")
	if m, _ := accessJoin(t, s, sale, s.Token(402, false), nil); m["type"] != "status" {
		t.Fatalf("a shopper of no tier after publicFrom: %v; want a status", m)
	}

	// The operator changes the rule on the sale's update path: If-Match,
	// a new version, the audit log.
	g := s.Do("GET", fmt.Sprintf("/api/admin/sales/%d", sale), op, nil)
	s.Want(g, 200, "")
	u := s.Do("PATCH", fmt.Sprintf("/api/admin/sales/%d", sale), op, map[string]any{"access": map[string]any{"rule": "codes"}},
		"If-Match", g.Header.Get("ETag"))
	s.Want(u, 200, "")
	if a, _ := u.Body["access"].(map[string]any); a["rule"] != "codes" {
		t.Errorf("updated access %v", u.Body["access"])
	}
	s.Want(s.Do("PATCH", fmt.Sprintf("/api/admin/sales/%d", sale), op, map[string]any{"access": map[string]any{"rule": "open"}},
		"If-Match", g.Header.Get("ETag")), 412, "VERSION_CONFLICT")
	audit := s.Do("GET", "/api/admin/audit?limit=5", op, nil)
	s.Want(audit, 200, "")
	if !strings.Contains(string(audit.Raw), "sale.update") || !strings.Contains(string(audit.Raw), "codes") {
		t.Errorf("audit log %s; want the access change", audit.Raw)
	}
}

// TestOpenAPIAccess: the access routes' requests and answers, and the
// joins they refuse, match docs/openapi.yaml.
func TestOpenAPIAccess(t *testing.T) {
	s := apptest.Start(t)
	c := newSpecCheck(t, s)
	op := s.Token(1, true)
	created := c.call(false, "POST", "/api/admin/sales", op, map[string]any{
		"name": "openapi access", "startsAt": time.Now().Add(time.Hour).UTC().Format(time.RFC3339), "admissionRatePerSecond": 10,
		"access": map[string]any{"rule": "codes", "publicFrom": time.Now().Add(30 * time.Minute).UTC().Format(time.RFC3339),
			"tiers": []map[string]any{{"tier": 1}}},
		"items": []map[string]any{{"productId": 501, "quantity": 1, "priceCents": 1999}},
	})
	s.Want(created, 201, "")
	sale := int64(created.Body["id"].(float64))
	base := fmt.Sprintf("/api/admin/sales/%d", sale)
	s.Want(c.call(false, "GET", fmt.Sprintf("/api/flash-sales/sales/%d", sale), "", nil), 200, "")
	gen := c.call(false, "POST", base+"/codes", op, map[string]any{"count": 2, "tier": 1})
	s.Want(gen, 201, "")
	s.Want(c.call(false, "POST", base+"/codes", op, map[string]any{"codes": []string{"VIP2026"}, "maxUses": 5}), 201, "")
	s.Want(c.callInvalid("POST", base+"/codes", op, map[string]any{"count": 0}), 400, "INVALID")
	s.Want(c.call(false, "GET", base+"/codes", op, nil), 200, "")
	s.Want(c.call(false, "GET", base+"/codes", op, nil, "Accept", "text/csv"), 200, "")
	s.Want(c.call(false, "GET", base+"/codes.csv", op, nil), 200, "")
	put := c.exchange(true, s.App.PublicURL, "PUT", base+"/allowlist", op, []byte("userId,tier\n9,1\n"), "Content-Type", "text/csv")
	s.Want(put, 200, "")
	s.Want(c.exchange(true, s.App.PublicURL, "POST", base+"/allowlist", op, []byte("10\n"), "Content-Type", "text/csv",
		"If-Match", put.Header.Get("ETag")), 200, "")
	s.Want(c.exchange(false, s.App.PublicURL, "PUT", base+"/allowlist", op, []byte("x\n"), "Content-Type", "text/csv"), 400, "INVALID")
	s.Want(c.exchange(true, s.App.PublicURL, "PUT", base+"/allowlist", op, []byte("9\n"), "Content-Type", "text/csv",
		"If-Match", put.Header.Get("ETag")), 412, "VERSION_CONFLICT")
	s.Want(c.call(false, "GET", base+"/allowlist", op, nil, "Accept", "text/csv"), 200, "")
	s.Want(c.call(false, "GET", base+"/allowlist", op, nil), 200, "")
	queue := fmt.Sprintf("/api/flash-sales/sales/%d/queue", sale)
	s.Want(c.call(false, "POST", queue, s.Token(20, false), nil), 403, "NOT_INVITED")
	s.Want(c.call(false, "POST", queue, s.Token(20, false), map[string]any{"code": "NOPE1234"}), 403, "CODE_INVALID")
	code := gen.Body["codes"].([]any)[0].(map[string]any)["code"].(string)
	s.Want(c.call(false, "POST", queue, s.Token(20, false), map[string]any{"code": code}), 200, "")
	s.Want(c.call(false, "PATCH", base, op, map[string]any{"access": map[string]any{"rule": "allowlist"}}), 200, "")
	s.Want(c.call(false, "GET", "/api/admin/audit?limit=20", op, nil), 200, "")
}

// TestAccessPresale: a codes sale with a presale hour. A code of tier 1
// is refused NOT_YET before the tier's start and is not spent; from the
// start it joins. A shopper without a code is NOT_INVITED, with the
// public start in the message, until then, and joins without one after.
func TestAccessPresale(t *testing.T) {
	var clock jumpClock
	s := apptest.Start(t, func(c *wiring.Config) { c.Clock = clock.Now })
	op := s.Token(1, true)
	now := clock.Now()
	presale, public := now.Add(2*time.Minute).Truncate(time.Second).UTC(), now.Add(8*time.Minute).Truncate(time.Second).UTC()
	sale := createAccessSale(t, s, now, map[string]any{"rule": "codes", "publicFrom": public.Format(time.RFC3339),
		"tiers": []map[string]any{{"tier": 1, "joinFrom": presale.Format(time.RFC3339)}}})
	gen := s.Do("POST", fmt.Sprintf("/api/admin/sales/%d/codes", sale), op, map[string]any{"count": 1, "tier": 1})
	s.Want(gen, 201, "")
	code := gen.Body["codes"].([]any)[0].(map[string]any)["code"].(string)
	queue := fmt.Sprintf("/api/flash-sales/sales/%d/queue", sale)
	used := func() float64 {
		r := s.Do("GET", fmt.Sprintf("/api/admin/sales/%d/codes", sale), op, nil)
		s.Want(r, 200, "")
		return r.Body["codes"].([]any)[0].(map[string]any)["used"].(float64)
	}

	s.Want(s.Do("POST", queue, s.Token(500, false), map[string]any{"code": code}), 403, "NOT_YET")
	wantWSRefused(t, s, sale, s.Token(500, false), map[string]any{"code": code}, "NOT_YET")
	if u := used(); u != 0 {
		t.Fatalf("code used %v times after NOT_YET, want 0", u)
	}
	r := s.Do("POST", queue, s.Token(501, false), nil)
	s.Want(r, 403, "NOT_INVITED")
	if msg, _ := r.Body["message"].(string); !strings.Contains(msg, public.Format(time.RFC3339)) {
		t.Errorf("NOT_INVITED message %q; want the public start", msg)
	}

	clock.AdvanceTo(presale)
	s.Want(s.Do("POST", queue, s.Token(500, false), map[string]any{"code": code}), 200, "")
	s.Want(s.Do("POST", queue, s.Token(501, false), nil), 403, "NOT_INVITED")
	clock.AdvanceTo(public)
	s.Want(s.Do("POST", queue, s.Token(501, false), nil), 200, "")
	if m, _ := accessJoin(t, s, sale, s.Token(502, false), nil); m["type"] != "status" {
		t.Fatalf("a shopper without a code after publicFrom: %v; want a status", m)
	}
	if u, j := used(), queueJoined(t, s, sale); u != 1 || j != 3 {
		t.Errorf("code used %v, joined %d; want 1 and 3", u, j)
	}
}
