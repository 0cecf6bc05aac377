package waitroom

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/admission"
)

func TestParseClientMessage(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr bool
		token   string
		pow     string
	}{
		{"join", `{"type":"join","accessToken":"abc"}`, false, "abc", ""},
		{"join with pow", `{"type":"join","accessToken":"abc","pow":{"nonce":"1"}}`, false, "abc", `{"nonce":"1"}`},
		{"pow null", `{"type":"join","accessToken":"abc","pow":null}`, false, "abc", ""},
		{"no token", `{"type":"join"}`, false, "", ""},
		{"spaces", "  {\"type\":\"join\",\"accessToken\":\"x\"}\n", false, "x", ""},
		{"not join", `{"type":"leave"}`, true, "", ""},
		{"no type", `{"accessToken":"abc"}`, true, "", ""},
		{"garbage", `hello`, true, "", ""},
		{"empty", ``, true, "", ""},
		{"array", `[{"type":"join"}]`, true, "", ""},
		{"token not string", `{"type":"join","accessToken":5}`, true, "", ""},
		{"pow not object", `{"type":"join","accessToken":"a","pow":"x"}`, true, "", ""},
		{"trailing", `{"type":"join","accessToken":"a"} {}`, true, "", ""},
		{"choose", `{"type":"choose","itemId":7}`, false, "", ""},
		{"choose with token", `{"type":"choose","itemId":7,"accessToken":"x"}`, false, "", ""},
		{"choose no item", `{"type":"choose"}`, true, "", ""},
		{"choose item 0", `{"type":"choose","itemId":0}`, true, "", ""},
		{"choose negative", `{"type":"choose","itemId":-3}`, true, "", ""},
		{"choose fraction", `{"type":"choose","itemId":1.5}`, true, "", ""},
		{"choose string", `{"type":"choose","itemId":"7"}`, true, "", ""},
		{"choose too big", `{"type":"choose","itemId":9223372036854775808}`, true, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := ParseClientMessage([]byte(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil {
				if got := flashsale.ErrorCode(err); got != flashsale.CodeInvalid {
					t.Fatalf("code = %s, want INVALID", got)
				}
				return
			}
			if m.Type == TypeChoose && m.ItemID != 7 {
				t.Fatalf("got item %d, want 7", m.ItemID)
			}
			if m.AccessToken != tt.token || string(m.PoW) != tt.pow {
				t.Fatalf("got token %q pow %q, want %q %q", m.AccessToken, m.PoW, tt.token, tt.pow)
			}
		})
	}
}

func FuzzParseClientMessage(f *testing.F) {
	for _, s := range []string{`{"type":"join","accessToken":"abc"}`, `{"type":"join","accessToken":"a","pow":{"n":1}}`,
		`{"type":"x"}`, `[]`, `{"type":"join","pow":[1]}`, "\x00", `{"type":"join","accessToken":"\u00e9"}`,
		`{"type":"choose","itemId":12}`, `{"type":"choose","itemId":-1}`, `{"type":"choose","itemId":1e3}`,
		`{"type":"join","accessToken":"a","code":"VIP2026"}`, `{"type":"join","code":7}`,
		`{"accessToken":"eyJ.a-b_c","type":"join"}`, `{"type":"join","accessToken":"x"}"}`, `{"type":"join","accessToken":""}`,
		`{"accessToken":"","type":"join"}`, `{"type":"join","accessToken":"a\"}`, `{"type":"join","accessToken":"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseClientMessage(b)
		// The bare join's fast path answers what encoding/json does.
		slow, serr := parseClientJSON(bytes.TrimSpace(b))
		if (err == nil) != (serr == nil) || (err != nil && err.Error() != serr.Error()) ||
			m.Type != slow.Type || m.AccessToken != slow.AccessToken || m.ItemID != slow.ItemID ||
			m.Code != slow.Code || !bytes.Equal(m.PoW, slow.PoW) {
			t.Fatalf("%q: parsed %+v (%v), encoding/json %+v (%v)", b, m, err, slow, serr)
		}
		if err != nil {
			if flashsale.ErrorCode(err) != flashsale.CodeInvalid {
				t.Fatalf("error code %s, want INVALID", flashsale.ErrorCode(err))
			}
			return
		}
		switch m.Type {
		case TypeJoin:
			if len(m.Code) > MaxCodeLen {
				t.Fatalf("accepted a code of %d bytes", len(m.Code))
			}
		case TypeChoose:
			if m.ItemID <= 0 || m.AccessToken != "" || m.PoW != nil || m.Code != "" {
				t.Fatalf("accepted choose %+v", m)
			}
		default:
			t.Fatalf("accepted type %q", m.Type)
		}
		if len(m.PoW) > 0 && m.PoW[0] != '{' {
			t.Fatalf("accepted pow %q", m.PoW)
		}
		// What parses re-encodes and parses to the same message.
		again, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		m2, err := ParseClientMessage(again)
		if err != nil {
			t.Fatalf("re-parse %q: %v", again, err)
		}
		if m2.Type != m.Type || m2.ItemID != m.ItemID || m2.AccessToken != m.AccessToken || !bytes.Equal(compact(t, m2.PoW), compact(t, m.PoW)) {
			t.Fatalf("round trip changed %+v into %+v", m, m2)
		}
	})
}

func compact(t *testing.T, b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		t.Fatalf("compact %q: %v", b, err)
	}
	return out.Bytes()
}

func TestStatusJSON(t *testing.T) {
	tests := []struct {
		name string
		in   Status
		want string
	}{
		{"status", Status{Type: TypeStatus, State: StateWaiting, ServerTimeMs: 5, OpensAtMs: 4, Position: 3, EtaSeconds: 2},
			`{"type":"status","state":"WAITING","serverTimeMs":5,"opensAtMs":4,"position":3,"etaSeconds":2}`},
		{"challenge", Status{Type: TypeChallenge, Challenge: json.RawMessage(`{"difficulty":3,"prefix":"ab"}`)},
			`{"difficulty":3,"prefix":"ab","type":"challenge"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := json.Marshal(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tt.want {
				t.Fatalf("got %s, want %s", b, tt.want)
			}
		})
	}
	if got, want := string(appendStatus(nil, view{state: StateWaiting, position: 3, eta: 2}, 5, 4)),
		`{"type":"status","state":"WAITING","serverTimeMs":5,"opensAtMs":4,"position":3,"etaSeconds":2}`; got != want {
		t.Fatalf("appendStatus = %s, want %s", got, want)
	}
	// The sold-out items: [] for none, absent while unknown (above).
	for _, tc := range []struct {
		ids  []int64
		want string
	}{{nil, `[]`}, {[]int64{1001}, `[1001]`}, {[]int64{1001, 1003}, `[1001,1003]`}} {
		got := string(appendStatus(nil, view{state: StateAdmitted, out: newItemsOut(tc.ids)}, 5, 4))
		want := `{"type":"status","state":"ADMITTED","serverTimeMs":5,"opensAtMs":4,"position":0,"etaSeconds":0,"soldOutItems":` + tc.want + `}`
		if got != want {
			t.Errorf("appendStatus = %s, want %s", got, want)
		}
	}
	// The choice (queue order), and whether it is sold out, as the
	// polling answer writes them.
	for _, tc := range []struct {
		name string
		v    view
		poll Status
	}{
		{"chosen", view{state: StateWaiting, position: 1, out: newItemsOut([]int64{1002}), chosen: 1001},
			Status{Type: TypeStatus, State: StateWaiting, ServerTimeMs: 5, OpensAtMs: 4, Position: 1, SoldOutItems: &[]int64{1002}, ChosenItemID: 1001}},
		{"chosen sold out", view{state: StateSoldOut, out: newItemsOut([]int64{1001, 1002}), chosen: 1001},
			Status{Type: TypeStatus, State: StateSoldOut, ServerTimeMs: 5, OpensAtMs: 4, SoldOutItems: &[]int64{1001, 1002}, ChosenItemID: 1001, ChosenSoldOut: true}},
	} {
		got := string(appendStatus(nil, tc.v, 5, 4))
		want, err := json.Marshal(tc.poll)
		if err != nil {
			t.Fatal(err)
		}
		// Field order differs (soldOutItems last in the struct order of
		// the polling answer): compare as objects.
		var g, w map[string]any
		if err := json.Unmarshal([]byte(got), &g); err != nil {
			t.Fatalf("%s: appendStatus wrote %s: %v", tc.name, got, err)
		}
		_ = json.Unmarshal(want, &w)
		if gb, wb := fmt.Sprint(g), fmt.Sprint(w); gb != wb {
			t.Errorf("%s: appendStatus = %s, want %s", tc.name, got, want)
		}
	}
	if got, want := string(appendChoiceRefused(nil, 7, errChoiceClosed)),
		`{"type":"choiceRefused","error":"CHOICE_CLOSED","message":"your turn has come: the item held for you is fixed","itemId":7}`; got != want {
		t.Errorf("appendChoiceRefused = %s, want %s", got, want)
	}
}

// appendAdmitted writes what json.Marshal of admittedMessage writes.
func TestAdmittedJSON(t *testing.T) {
	sale := &flashsale.Sale{ID: 3, Items: []flashsale.Item{{ID: 1001}, {ID: 1002}}}
	items := admittedItems(sale)
	itemsJS, err := json.Marshal(items)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := admission.NewSigner(admission.Key{ID: 1, Secret: []byte("0123456789abcdef0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	tok := signer.Sign(flashsale.Admission{UserID: 7, SaleID: 3, ExpiresAt: time.UnixMilli(1764469200123)})
	want, err := json.Marshal(admittedMessage{Type: TypeAdmitted, AdmissionToken: tok, ExpiresAtMs: 1764469200123, Items: items})
	if err != nil {
		t.Fatal(err)
	}
	if got := appendAdmitted(nil, tok, 1764469200123, 0, 0, itemsJS); string(got) != string(want) {
		t.Fatalf("appendAdmitted = %s, want %s", got, want)
	}
	want, err = json.Marshal(admittedMessage{Type: TypeAdmitted, AdmissionToken: tok, ExpiresAtMs: 1764469200123, NotBeforeMs: 1764469100000, Items: items})
	if err != nil {
		t.Fatal(err)
	}
	if got := appendAdmitted(nil, tok, 1764469200123, 1764469100000, 0, itemsJS); string(got) != string(want) {
		t.Fatalf("appendAdmitted with not-before = %s, want %s", got, want)
	}
	held := heldItems(items, 1002)
	heldJS, err := json.Marshal(held)
	if err != nil {
		t.Fatal(err)
	}
	want, err = json.Marshal(admittedMessage{Type: TypeAdmitted, AdmissionToken: tok, ExpiresAtMs: 1764469200123, NotBeforeMs: 1764469100000,
		HoldUntilMs: 1764469200123, HeldItemID: 1002, Items: held})
	if err != nil {
		t.Fatal(err)
	}
	if got := appendAdmitted(nil, tok, 1764469200123, 1764469100000, 1002, heldJS); string(got) != string(want) {
		t.Fatalf("appendAdmitted with a hold = %s, want %s", got, want)
	}
}

// TestParseClientMessageCode: a join carries the invitation code as
// given; an over-long one is INVALID; a choose drops it.
func TestParseClientMessageCode(t *testing.T) {
	for _, tt := range []struct {
		name, in, code string
		invalid        bool
	}{
		{"code", `{"type":"join","accessToken":"a","code":"vip2026"}`, "vip2026", false},
		{"none", `{"type":"join","accessToken":"a"}`, "", false},
		{"longest", `{"type":"join","accessToken":"a","code":"` + strings.Repeat("A", MaxCodeLen) + `"}`, strings.Repeat("A", MaxCodeLen), false},
		{"too long", `{"type":"join","accessToken":"a","code":"` + strings.Repeat("A", MaxCodeLen+1) + `"}`, "", true},
		{"not a string", `{"type":"join","accessToken":"a","code":7}`, "", true},
		{"choose", `{"type":"choose","itemId":3,"code":"X"}`, "", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m, err := ParseClientMessage([]byte(tt.in))
			if got := flashsale.ErrorCode(err) == flashsale.CodeInvalid; got != tt.invalid {
				t.Fatalf("err = %v, want invalid %v", err, tt.invalid)
			}
			if m.Code != tt.code {
				t.Errorf("code = %q, want %q", m.Code, tt.code)
			}
		})
	}
}

// BenchmarkParseJoin parses the page's join: the bare-join fast path
// against encoding/json (parseClientJSON).
func BenchmarkParseJoin(b *testing.B) {
	msg := []byte(`{"type":"join","accessToken":"eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwiZXhwIjoxOTAwMDAwMDAwfQ.c2lnbmF0dXJlLXNpZ25hdHVyZS1zaWduYXR1cmU"}`)
	for _, bc := range []struct {
		name  string
		parse func([]byte) (ClientMessage, error)
	}{{"fast", ParseClientMessage}, {"json", parseClientJSON}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := bc.parse(msg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
