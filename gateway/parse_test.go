package gateway

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/flashsale/flashsale"
)

func TestParseID(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"1", 1, true}, {"101", 101, true}, {"9223372036854775807", 1<<63 - 1, true},
		{"9223372036854775808", 0, false}, {"99999999999999999999", 0, false},
		{"", 0, false}, {"0", 0, false}, {"01", 0, false}, {"-1", 0, false}, {"+1", 0, false},
		{"1a", 0, false}, {" 1", 0, false}, {"1e3", 0, false}, {"١", 0, false},
	}
	for _, tt := range tests {
		got, ok := parseID(tt.in)
		if got != tt.want || ok != tt.ok {
			t.Errorf("parseID(%q) = %d, %v; want %d, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func FuzzParseID(f *testing.F) {
	for _, s := range []string{"1", "0", "01", "-1", "9223372036854775807", "9223372036854775808", "18446744073709551616", "abc"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := parseID(s)
		ref, err := strconv.ParseInt(s, 10, 64)
		want := err == nil && ref > 0 && strconv.FormatInt(ref, 10) == s
		if ok != want || (ok && got != ref) {
			t.Fatalf("parseID(%q) = %d, %v; strconv says %d, %v", s, got, ok, ref, want)
		}
	})
}

func TestParseItemQuery(t *testing.T) {
	tests := []struct {
		name    string
		q       string
		id      int64
		present bool
		wantErr bool
	}{
		{"none", "", 0, false, false},
		{"other params", "a=1&b=2", 0, false, false},
		{"item", "itemId=42", 42, true, false},
		{"among others", "x=1&itemId=42&y=2", 42, true, false},
		{"zero", "itemId=0", 0, false, true},
		{"negative", "itemId=-1", 0, false, true},
		{"empty", "itemId=", 0, false, true},
		{"not a number", "itemId=abc", 0, false, true},
		{"twice", "itemId=1&itemId=2", 0, false, true},
		{"too big", "itemId=9223372036854775808", 0, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, present, err := parseItemQuery([]byte(tt.q))
			if (err != nil) != tt.wantErr || id != tt.id || present != tt.present {
				t.Fatalf("parseItemQuery(%q) = %d, %v, %v; want %d, %v, error %v", tt.q, id, present, err, tt.id, tt.present, tt.wantErr)
			}
			if err != nil && flashsale.ErrorCode(err) != flashsale.CodeInvalid {
				t.Fatalf("code %s, want INVALID", flashsale.ErrorCode(err))
			}
		})
	}
}

func FuzzParseItemQuery(f *testing.F) {
	for _, s := range []string{"", "itemId=1", "itemId=1&itemId=1", "itemId=%31", "itemId=01", "a&itemId", "itemId=9223372036854775807"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, q []byte) {
		id, present, err := parseItemQuery(q)
		if err != nil {
			if flashsale.ErrorCode(err) != flashsale.CodeInvalid || present || id != 0 {
				t.Fatalf("parseItemQuery(%q) = %d, %v, %v", q, id, present, err)
			}
			return
		}
		if present != (id > 0) {
			t.Fatalf("parseItemQuery(%q) = %d, present %v", q, id, present)
		}
		if present {
			// What it accepts is one itemId that parses as an id.
			again, ok := parseID(strconv.FormatInt(id, 10))
			if !ok || again != id {
				t.Fatalf("parseItemQuery(%q) = %d, not an id", q, id)
			}
		}
	})
}

func TestParseUUID(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{orderA, orderA, true},
		{strings.ToUpper(orderA), orderA, true},
		{"3f1c9a528c5e4c579f0e1d2b3c4d5e6f", "", false},
		{"{" + orderA + "}", "", false},
		{"urn:uuid:" + orderA, "", false},
		{orderA[:35] + "g", "", false},
		{strings.ReplaceAll(orderA, "-", "_"), "", false},
		{"", "", false},
	}
	for _, tt := range tests {
		got, ok := parseUUID(tt.in)
		if got != tt.want || ok != tt.ok {
			t.Errorf("parseUUID(%q) = %q, %v; want %q, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func FuzzParseUUID(f *testing.F) {
	f.Add(orderA)
	f.Add(strings.ToUpper(orderA))
	f.Add("3f1c9a528c5e4c579f0e1d2b3c4d5e6f")
	f.Add("xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := parseUUID(s)
		if !ok {
			if len(s) == 36 {
				if _, err := uuid.Parse(s); err == nil {
					t.Fatalf("parseUUID refused canonical %q", s)
				}
			}
			return
		}
		u, err := uuid.Parse(s)
		if err != nil {
			t.Fatalf("parseUUID accepted %q: %v", s, err)
		}
		if got != u.String() {
			t.Fatalf("parseUUID(%q) = %q, want %q", s, got, u.String())
		}
	})
}

func TestBearerToken(t *testing.T) {
	tests := []struct{ in, want string }{
		{"Bearer abc", "abc"}, {"bearer abc", "abc"}, {"BEARER  abc ", "abc"},
		{"Bearer ", ""}, {"Bearer", ""}, {"Basic abc", ""}, {"abc", ""}, {"", ""}, {"Bearerabc", ""},
	}
	for _, tt := range tests {
		if got := bearerToken(tt.in); got != tt.want {
			t.Errorf("bearerToken(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func FuzzBearerToken(f *testing.F) {
	for _, s := range []string{"Bearer abc", "bearer  x ", "Basic x", "", "Bearer"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, h string) {
		tok := bearerToken(h)
		if tok == "" {
			return
		}
		if !strings.EqualFold(h[:7], "bearer ") || !strings.Contains(h, tok) {
			t.Fatalf("bearerToken(%q) = %q", h, tok)
		}
		if tok[0] == ' ' || tok[len(tok)-1] == ' ' {
			t.Fatalf("bearerToken(%q) = %q not trimmed", h, tok)
		}
	})
}

func FuzzParseSaleRequest(f *testing.F) {
	f.Add(`{"name":"n","startsAt":"2026-12-01T18:00:00Z","admissionRatePerSecond":5,"items":[{"productId":1,"quantity":1,"priceCents":0}]}`)
	f.Add(`{"items":[{}]}`)
	f.Add(`{"name":"n","startsAt":"2026-12-01T18:00:00Z","admissionRatePerSecond":5,"stockShards":3,"items":[{"productId":1,"quantity":1,"priceCents":0}]}`)
	f.Add(`{"name":5}`)
	f.Add(`[]`)
	f.Add(`{"name":"n","startsAt":"2026-12-01T18:00:00Z","admissionRatePerSecond":5,"items":[{"productId":1,"quantity":1,"priceCents":0,"name":"Red","currency":"EUR","imageUrl":"https://cdn.example/a.png"}]}`)
	f.Add(`{"name":"n","startsAt":"2026-12-01T18:00:00Z","admissionRatePerSecond":5,"items":[{"productId":1,"quantity":1,"priceCents":0,"imageUrl":"//evil.example/a.png"}]}`)
	f.Fuzz(func(t *testing.T, body string) {
		s, err := parseSaleRequest([]byte(body))
		if err != nil {
			return
		}
		if s.Name == "" || s.AdmissionRatePerSecond < 1 || len(s.Items) == 0 || s.StartsAt.IsZero() ||
			s.Shards() < 1 || s.Shards() > flashsale.MaxStockShards {
			t.Fatalf("accepted %q as %+v", body, s)
		}
		for _, it := range s.Items {
			if it.Quantity < 1 || it.PriceCents < 0 || it.ProductID < 1 || len(it.Name) > flashsale.MaxItemNameLen ||
				(it.Currency != "" && !flashsale.ValidCurrency(it.Currency)) || len(it.ImageURL) > flashsale.MaxImageURLLen ||
				strings.HasPrefix(it.ImageURL, "//") || (it.ImageURL != "" && !strings.HasPrefix(it.ImageURL, "/") &&
				!strings.HasPrefix(it.ImageURL, "http://") && !strings.HasPrefix(it.ImageURL, "https://")) {
				t.Fatalf("accepted item %+v from %q", it, body)
			}
		}
	})
}

func FuzzAppendJSONString(f *testing.F) {
	for _, s := range []string{"", "plain", `q"uote\`, "tab\tnl\n", "\x00\x1f", "é€😀", "\xff\xfe", "<script>&"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b := appendJSONString(nil, s)
		var got string
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("appendJSONString(%q) = %s: %v", s, b, err)
		}
		if utf8.ValidString(s) && got != s {
			t.Fatalf("round trip of %q gave %q", s, got)
		}
		if bytes.ContainsAny(b, "<>&") {
			t.Fatalf("unescaped HTML characters in %s", b)
		}
	})
}
