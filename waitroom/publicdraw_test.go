package waitroom

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/lua"
)

// TestDrawRecordMatchesAdmissions: the public record is NOT_DRAWN before
// opening; after the draw it lists every pre-queue ticket's holder by tag,
// and the places recomputed from it alone are the places the room
// admitted each shopper at.
func TestDrawRecordMatchesAdmissions(t *testing.T) {
	e := newEnv(t)
	opens := e.clock.Now().Add(time.Hour)
	sale := e.addSale(newSale(t, 31, opens, 100_000, 1000))
	g := e.newGateway(Config{}, nil)
	ctx := context.Background()
	const pre = 60
	g.joinUsers(t, sale.ID, pre)

	if _, err := g.room.DrawRecord(ctx, sale); flashsale.ErrorCode(err) != flashsale.CodeNotDrawn {
		t.Fatalf("before opening: err %v, want NOT_DRAWN", err)
	}
	e.clock.Advance(time.Hour)
	eventually(t, "everyone admitted", 10*time.Second, func() bool {
		e.clock.Advance(100 * time.Millisecond)
		return g.admitted(t, sale.ID) >= pre
	})

	rec, err := g.room.DrawRecord(ctx, sale)
	if err != nil {
		t.Fatal(err)
	}
	if rec.PreQueueSize != pre || len(rec.Members) != pre || rec.Seed != sale.SeedHex() || rec.Commitment != sale.ShuffleCommitment {
		t.Fatalf("record: n %d, %d members, seed %s, commitment %s", rec.PreQueueSize, len(rec.Members), rec.Seed, rec.Commitment)
	}
	// Through the wire format.
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(rec); err != nil {
		t.Fatal(err)
	}
	parsed, err := ParseDrawRecord(&buf, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	chk, err := CheckDrawRecord(parsed)
	if err != nil {
		t.Fatal(err)
	}
	// A shopper's admission is recorded when the room next answers them;
	// the answer carries the shopper's member secret.
	secrets := map[int64][MemberSecretBytes]byte{}
	for u := int64(1); u <= pre; u++ {
		st, err := g.room.Status(ctx, flashsale.Principal{UserID: u}, sale.ID)
		if err != nil || st.AdmissionToken == "" {
			t.Fatalf("user %d: status %+v, %v", u, st, err)
		}
		if secrets[u], err = ParseMemberSecret(st.DrawSecret); err != nil {
			t.Fatalf("user %d: drawSecret %q: %v", u, st.DrawSecret, err)
		}
	}
	adm, err := e.rdb.HGetAll(ctx, lua.QueueKey(sale.ID, keyAdmitted)).Result()
	if err != nil || len(adm) != pre {
		t.Fatalf("admissions: %d, %v", len(adm), err)
	}
	for us, v := range adm {
		u, _ := strconv.ParseInt(us, 10, 64)
		place, _, err := parseAdmission(v)
		if err != nil {
			t.Fatal(err)
		}
		ticket, ok := parsed.FindMember(u, secrets[u])
		if !ok {
			t.Fatalf("user %d not found by its tag", u)
		}
		if _, ok := parsed.FindMember(u, secrets[u%pre+1]); ok {
			t.Fatalf("user %d found with another user's secret", u)
		}
		if got := chk.Places[ticket]; got != place {
			t.Fatalf("user %d: record gives place %d, admitted at %d", u, got, place)
		}
		if chk.Order[place] != ticket {
			t.Fatalf("order[%d] = %d, want ticket %d", place, chk.Order[place], ticket)
		}
	}
	if _, ok := parsed.FindMember(pre+1, MemberSecret(g.room.cfg.DrawKey, sale.ID, pre+1)); ok {
		t.Fatal("a user who never joined was found")
	}
}

// TestDrawRecordIncomplete: a pre-queue only partly in Redis (a stale
// replica) is an error, never a short record.
func TestDrawRecordIncomplete(t *testing.T) {
	e := newEnv(t)
	opens := e.clock.Now().Add(time.Hour)
	sale := e.addSale(newSale(t, 32, opens, 100_000, 1000))
	g := e.newGateway(Config{}, nil)
	ctx := context.Background()
	g.joinUsers(t, sale.ID, 5)
	e.clock.Advance(time.Hour)
	eventually(t, "draw", 10*time.Second, func() bool { _, err := g.room.DrawRecord(ctx, sale); return err == nil })
	if err := e.rdb.RPop(ctx, lua.QueueKey(sale.ID, keyOrder)).Err(); err != nil {
		t.Fatal(err)
	}
	// Everyone was admitted at once, so nothing restores the list; the
	// record must refuse rather than publish four members.
	if rec, err := g.room.DrawRecord(ctx, sale); flashsale.ErrorCode(err) != flashsale.CodeUnavailable {
		t.Fatalf("record of a short list: %d members, error %v; want UNAVAILABLE", len(rec.Members), err)
	}
}

func validRecordJSON(t testing.TB, n int) (DrawRecord, []byte) {
	t.Helper()
	s := newSale(t, 9, time.Now(), 1, 1)
	rec := DrawRecord{Version: DrawRecordVersion, SaleID: 9, Seed: s.SeedHex(), Commitment: s.ShuffleCommitment, PreQueueSize: int64(n)}
	for i := range n {
		rec.Members = append(rec.Members, MemberTag(s.ShuffleSeed, 9, int64(i+1), MemberSecret([]byte("k"), 9, int64(i+1))))
	}
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	return rec, b
}

func TestParseAndCheckDrawRecord(t *testing.T) {
	rec, good := validRecordJSON(t, 5)
	tamper := func(f func(r *DrawRecord)) string {
		r := rec
		r.Members = append([]string(nil), rec.Members...)
		f(&r)
		b, _ := json.Marshal(r)
		return string(b)
	}
	otherSeed := newSale(t, 9, time.Now(), 1, 1)
	tests := []struct {
		name      string
		body      string
		parseFail bool
		checkFail bool
	}{
		{name: "valid", body: string(good)},
		{name: "valid, empty", body: `{"version":2,"saleId":9,"seed":"` + rec.Seed + `","commitment":"` + rec.Commitment + `","preQueueSize":0,"members":[]}`},
		{name: "a hole", body: tamper(func(r *DrawRecord) { r.Members[2] = "" })},
		{name: "not JSON", body: "{", parseFail: true},
		{name: "trailing data", body: string(good) + "{}", parseFail: true},
		{name: "version 1", body: tamper(func(r *DrawRecord) { r.Version = 1 }), parseFail: true},
		{name: "version 3 without tiers", body: tamper(func(r *DrawRecord) { r.Version = 3 }), parseFail: true},
		{name: "version 3, by tier", body: tamper(func(r *DrawRecord) { r.Version, r.Tiers = 3, "10290" })},
		{name: "version 3, short tiers", body: tamper(func(r *DrawRecord) { r.Version, r.Tiers = 3, "1029" }), parseFail: true},
		{name: "version 3, tier not a digit", body: tamper(func(r *DrawRecord) { r.Version, r.Tiers = 3, "10a90" }), parseFail: true},
		{name: "version 2 with tiers", body: tamper(func(r *DrawRecord) { r.Tiers = "10290" }), parseFail: true},
		{name: "version 4", body: tamper(func(r *DrawRecord) { r.Version = 4 }), parseFail: true},
		{name: "no sale", body: tamper(func(r *DrawRecord) { r.SaleID = 0 }), parseFail: true},
		{name: "short seed", body: tamper(func(r *DrawRecord) { r.Seed = r.Seed[:62] }), parseFail: true},
		{name: "upper-case seed", body: tamper(func(r *DrawRecord) { r.Seed = strings.ToUpper(r.Seed) }), parseFail: true},
		{name: "bad commitment", body: tamper(func(r *DrawRecord) { r.Commitment = "zz" + r.Commitment[2:] }), parseFail: true},
		{name: "size differs", body: tamper(func(r *DrawRecord) { r.PreQueueSize = 4 }), parseFail: true},
		{name: "bad tag", body: tamper(func(r *DrawRecord) { r.Members[1] = "abc" }), parseFail: true},
		{name: "same holder twice", body: tamper(func(r *DrawRecord) { r.Members[3] = r.Members[0] }), parseFail: true},
		{name: "seed changed", body: tamper(func(r *DrawRecord) { r.Seed = otherSeed.SeedHex() }), checkFail: true},
		{name: "commitment changed", body: tamper(func(r *DrawRecord) { r.Commitment = otherSeed.ShuffleCommitment }), checkFail: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseDrawRecord(strings.NewReader(tt.body), 1<<20)
			if (err != nil) != tt.parseFail {
				t.Fatalf("parse error %v, want failure %v", err, tt.parseFail)
			}
			if err != nil {
				return
			}
			chk, err := CheckDrawRecord(got)
			if (err != nil) != tt.checkFail {
				t.Fatalf("check error %v, want failure %v", err, tt.checkFail)
			}
			if err == nil && len(chk.Order) != len(got.Members) {
				t.Fatalf("%d places for %d members", len(chk.Order), len(got.Members))
			}
		})
	}
	if _, err := ParseDrawRecord(bytes.NewReader(good), int64(len(good)-1)); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("over the limit: %v", err)
	}
}

// FuzzParseDrawRecord: any input either fails to parse or is a record
// whose check either fails or yields a permutation of its tickets.
func FuzzParseDrawRecord(f *testing.F) {
	_, good := validRecordJSON(f, 3)
	f.Add(good)
	f.Add([]byte(`{"version":2,"saleId":1,"seed":"","commitment":"","preQueueSize":0,"members":[]}`))
	f.Add([]byte(`{"members":[""],"preQueueSize":1}`))
	tiered, _ := validRecordJSON(f, 4)
	tiered.Version, tiered.Tiers = TieredDrawVersion, "2010"
	if b, err := json.Marshal(tiered); err == nil {
		f.Add(b)
	}
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := ParseDrawRecord(bytes.NewReader(b), 1<<16)
		if err != nil {
			return
		}
		chk, err := CheckDrawRecord(rec)
		if err != nil {
			return
		}
		seen := make([]bool, len(rec.Members))
		for _, tk := range chk.Order {
			if tk < 0 || tk >= int64(len(seen)) || seen[tk] {
				t.Fatalf("order %v is not a permutation", chk.Order)
			}
			seen[tk] = true
		}
	})
}

// TestDrawRecordLarge: a 500,000-ticket pre-queue gives a complete record
// whose places check out (docs/DRAW.md has its size).
func TestDrawRecordLarge(t *testing.T) {
	if os.Getenv("FLASHSALE_TEST_LARGE") == "" {
		t.Skip("a 500,000-ticket queue: set FLASHSALE_TEST_LARGE=1")
	}
	const n = 500_000
	e := newEnv(t)
	sale := e.addSale(newSale(t, 33, e.clock.Now().Add(-time.Minute), 1000, 10))
	r := New(Config{Now: e.clock.Now}, e.rdb, e.sales, e.stock, e.access, e.signer, nil, nil, nil)
	ctx := context.Background()
	order := lua.QueueKey(sale.ID, keyOrder)
	for first := 0; first < n; first += 10_000 {
		vals := make([]any, 10_000)
		for i := range vals {
			vals[i] = strconv.Itoa(first + i + 1)
		}
		if err := e.rdb.RPush(ctx, order, vals...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.rdb.HSet(ctx, lua.QueueKey(sale.ID, keyState), fieldN, n, "seq", n).Err(); err != nil {
		t.Fatal(err)
	}
	rec, err := r.DrawRecord(ctx, sale)
	if err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := ParseDrawRecord(bytes.NewReader(body), 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	chk, err := CheckDrawRecord(parsed)
	if err != nil || len(chk.Order) != n {
		t.Fatalf("check: %d places, %v", len(chk.Order), err)
	}
	if tk, ok := parsed.FindMember(n, MemberSecret(r.cfg.DrawKey, sale.ID, n)); !ok || tk != n-1 {
		t.Fatalf("user %d: ticket %d, %v", n, tk, ok)
	}
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed) // as the gateway sends it
	_, _ = zw.Write(body)
	_ = zw.Close()
	t.Logf("record of %d members: %d bytes, %d gzipped", n, len(body), gz.Len())
}

// TestMemberTag pins the secret and the tag to their definitions in
// docs/DRAW.md, computed here independently, so that a change of either is
// seen.
func TestMemberTag(t *testing.T) {
	key := []byte("server key")
	m := hmac.New(sha256.New, key)
	m.Write(append([]byte("flashsale/draw/secret/v1"), 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0x30, 0x39))
	var secret [MemberSecretBytes]byte
	copy(secret[:], m.Sum(nil))
	if got := MemberSecret(key, 9, 12345); got != secret {
		t.Fatalf("MemberSecret = %x, want %x", got, secret)
	}

	seed := bytes.Repeat([]byte{7}, 32)
	msg := append([]byte("flashsale/draw/member/v2"), 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0x30, 0x39)
	msg = append(msg, secret[:]...)
	m = hmac.New(sha256.New, seed)
	m.Write(msg)
	want := hex.EncodeToString(m.Sum(nil)[:16])
	if got := MemberTag(seed, 9, 12345, secret); got != want {
		t.Fatalf("MemberTag = %s, want %s", got, want)
	}
	other := MemberSecret(key, 9, 1)
	tg := newMemberTagger(seed, 9)
	if a, b := tg.tag(12345, secret), tg.tag(1, other); a != want || b != MemberTag(seed, 9, 1, other) || a == b {
		t.Fatalf("reused tagger: %s, %s", a, b)
	}
	if got, err := ParseMemberSecret(strings.ToUpper(hex.EncodeToString(secret[:]))); err != nil || got != secret {
		t.Fatalf("ParseMemberSecret(upper case) = %x, %v", got, err)
	}
}

func TestParseMemberSecret(t *testing.T) {
	for _, tt := range []struct{ name, in string }{
		{"empty", ""},
		{"short", strings.Repeat("a", 31)},
		{"long", strings.Repeat("a", 33)},
		{"not hex", strings.Repeat("g", 32)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := ParseMemberSecret(tt.in); err == nil {
				t.Fatalf("ParseMemberSecret(%q) accepted", tt.in)
			}
		})
	}
}

// FuzzParseMemberSecret: what parses is 16 bytes that print back to the
// input, case aside.
func FuzzParseMemberSecret(f *testing.F) {
	f.Add(strings.Repeat("0f", 16))
	f.Add("")
	f.Add(strings.Repeat("G", 32))
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseMemberSecret(s)
		if err != nil {
			return
		}
		if hex.EncodeToString(got[:]) != strings.ToLower(s) {
			t.Fatalf("ParseMemberSecret(%q) = %x", s, got)
		}
	})
}

// TestDrawPublishedOnce: the leader builds and stores the record at the
// draw, a tag per member once; reading the stored record computes no tag
// and reads no pre-queue, however often it is asked.
func TestDrawPublishedOnce(t *testing.T) {
	e := newEnv(t)
	opens := e.clock.Now().Add(time.Hour)
	sale := newSale(t, 34, opens, 100_000, 1000)
	sale.EndsAt = opens.Add(time.Hour)
	e.addSale(sale)
	pool := testenv.Postgres(t)
	g := e.newGateway(Config{Records: NewPGDraws(pool), Durable: NewPGDurable(pool)}, nil)
	ctx := context.Background()
	const pre = 20
	g.joinUsers(t, sale.ID, pre)
	if _, err := g.room.PublishedDraw(ctx, sale.ID, 1<<20); flashsale.ErrorCode(err) != flashsale.CodeNotDrawn {
		t.Fatalf("before the draw: %v, want NOT_DRAWN", err)
	}
	e.clock.Advance(time.Hour)
	var f DrawFile
	eventually(t, "the record published", 10*time.Second, func() bool {
		var err error
		f, err = g.room.PublishedDraw(ctx, sale.ID, 1<<20)
		return err == nil
	})
	if got := tagsComputed(t, g); got != pre {
		t.Fatalf("tags computed at the draw: %v, want %d", got, pre)
	}
	rec, err := ParseDrawRecord(bytes.NewReader(f.Body), 1<<20)
	if err != nil || len(rec.Members) != pre {
		t.Fatalf("stored record: %d members, %v", len(rec.Members), err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(f.Gzip))
	if err != nil {
		t.Fatal(err)
	}
	unz, err := io.ReadAll(zr)
	if err != nil || !bytes.Equal(unz, f.Body) {
		t.Fatalf("the gzip form is not the body: %v", err)
	}
	sum := sha256.Sum256(f.Body)
	if want := `"` + hex.EncodeToString(sum[:16]) + `"`; f.ETag != want || f.Size != int64(len(f.Body)) {
		t.Fatalf("etag %s size %d, want %s %d", f.ETag, f.Size, want, len(f.Body))
	}
	for range 5 {
		big, err := g.room.PublishedDraw(ctx, sale.ID, 10)
		if err != nil || big.Body != nil || big.Size != f.Size || !bytes.Equal(big.Gzip, f.Gzip) {
			t.Fatalf("record above maxBody: body %d bytes, size %d, %v", len(big.Body), big.Size, err)
		}
	}
	if got := tagsComputed(t, g); got != pre {
		t.Fatalf("tags after reads: %v, want %d", got, pre)
	}
	if got := func() float64 { v, _ := g.counterValue(t, "flashsale_waitroom_draw_records_total", "ok"); return v }(); got != 1 {
		t.Fatalf("records built: %v, want 1", got)
	}

	// After the end the queue keys get an expiry; the record stays.
	state := lua.QueueKey(sale.ID, keyState)
	if ttl, err := e.rdb.PTTL(ctx, state).Result(); err != nil || ttl != -1 {
		t.Fatalf("state key before the end: ttl %v, %v; want none", ttl, err)
	}
	e.clock.Advance(time.Hour + 2*time.Minute)
	eventually(t, "queue keys expiring", 10*time.Second, func() bool {
		e.clock.Advance(time.Second)
		ttl, err := e.rdb.PTTL(ctx, state).Result()
		return err == nil && ttl > 0
	})
	want := sale.EndsAt.Add(DefaultQueueKeyTTL).UnixMilli()
	for _, k := range []string{keyState, keyOrder, keyTickets} {
		at, err := e.rdb.PExpireTime(ctx, lua.QueueKey(sale.ID, k)).Result()
		if err != nil || at.Milliseconds() != want {
			t.Fatalf("%s expires at %v (%v), want %d", k, at, err, want)
		}
	}
}

func tagsComputed(t *testing.T, g *gateway) float64 {
	t.Helper()
	v, _ := g.counterValue(t, "flashsale_waitroom_draw_tags_total", "")
	return v
}
