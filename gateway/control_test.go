package gateway

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/flashsale/flashsale"
)

func TestParseIfMatch(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"", noIfMatch, true},
		{"*", noIfMatch, true},
		{` "7" `, 7, true},
		{"7", 7, true},
		{`"0"`, 0, true},
		{"9223372036854775807", 1<<63 - 1, true},
		{"9223372036854775808", 0, false},
		{`W/"7"`, 0, false},
		{`"7", "8"`, 0, false},
		{`"07"`, 0, false},
		{`"-1"`, 0, false},
		{`"`, 0, false},
		{`""`, 0, false},
		{"abc", 0, false},
	} {
		got, err := parseIfMatch(tc.in)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("parseIfMatch(%q) = %d, %v; want %d, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
		if err != nil && flashsale.ErrorCode(err) != flashsale.CodeInvalid {
			t.Errorf("parseIfMatch(%q): %v, want INVALID", tc.in, err)
		}
	}
}

func FuzzParseIfMatch(f *testing.F) {
	for _, s := range []string{"", "*", `"7"`, "7", `W/"7"`, `"1", "2"`, `"0"`, "99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, h string) {
		v, err := parseIfMatch(h)
		if err != nil {
			if flashsale.ErrorCode(err) != flashsale.CodeInvalid {
				t.Fatalf("%q: %v", h, err)
			}
			return
		}
		if v < noIfMatch {
			t.Fatalf("%q parsed as %d", h, v)
		}
	})
}

func TestParseStockRequest(t *testing.T) {
	for body, want := range map[string]string{
		`{"add": 1}`:        "",
		`{"add": 1000000}`:  "",
		`{"add": 0}`:        "add: must be 1 to 1000000",
		`{"add": 1000001}`:  "add: must be 1 to 1000000",
		`{"add": -1}`:       "add: must be 1 to 1000000",
		`{}`:                "add: required",
		`{"add": 1.5}`:      "add: wrong type",
		`{"add": "1"}`:      "add: wrong type",
		`{"add": 1, "x":1}`: "x: unknown field",
		`{"add": 1} {}`:     "malformed JSON: data after the object",
		``:                  "request body required",
		`[1]`:               "request body must be a JSON object",
	} {
		_, err := parseStockRequest([]byte(body))
		if got := flashsale.ErrorMessage(err); (want == "" && err != nil) || (want != "" && !strings.HasPrefix(got, want)) {
			t.Errorf("%s: %v, want %q", body, err, want)
		}
	}
}

func FuzzParseStockRequest(f *testing.F) {
	for _, s := range []string{`{"add": 1}`, `{"add": 0}`, `{"add": 1e3}`, `{"add": "1"}`, `{}`, `[]`, `{"add": 9223372036854775808}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		n, err := parseStockRequest([]byte(body))
		if err != nil {
			if flashsale.ErrorCode(err) != flashsale.CodeInvalid {
				t.Fatalf("%q: %v", body, err)
			}
			return
		}
		if n < 1 || n > flashsale.MaxStockAdd {
			t.Fatalf("%q accepted as %d", body, n)
		}
	})
}

func TestParseMessageRequest(t *testing.T) {
	long := strings.Repeat("é", flashsale.MaxMessageLen)
	for body, want := range map[string]string{
		`{"text": "  hi  "}`:         "",
		`{"text": ""}`:               "",
		`{"text": "` + long + `"}`:   "",
		`{"text": "` + long + `x"}`:  "text: at most 280 characters",
		`{"text": "a\u0000b"}`:       "text: must be UTF-8 text without control characters",
		`{"text": "line\nbreak"}`:    "text: must be UTF-8 text without control characters",
		`{}`:                         "text: required",
		`{"text": null}`:             "text: required",
		`{"text": 5}`:                "text: wrong type",
		`{"text": "a", "from": "b"}`: "from: unknown field",
	} {
		got, err := parseMessageRequest([]byte(body))
		if msg := flashsale.ErrorMessage(err); (want == "" && err != nil) || (want != "" && !strings.HasPrefix(msg, want)) {
			t.Errorf("%s: %q, %v; want %q", body, got, err, want)
		}
		if err == nil && got != strings.TrimSpace(got) {
			t.Errorf("%s: %q not trimmed", body, got)
		}
	}
}

func FuzzParseMessageRequest(f *testing.F) {
	for _, s := range []string{`{"text": "hi"}`, `{"text": ""}`, `{"text": "\u00e9\u0007"}`, `{"text": 1}`, `{}`, `{"text": "\ud800"}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		text, err := parseMessageRequest([]byte(body))
		if err != nil {
			if flashsale.ErrorCode(err) != flashsale.CodeInvalid {
				t.Fatalf("%q: %v", body, err)
			}
			return
		}
		if !utf8.ValidString(text) || utf8.RuneCountInString(text) > flashsale.MaxMessageLen || text != strings.TrimSpace(text) {
			t.Fatalf("%q accepted as %q", body, text)
		}
		for _, r := range text {
			if r < ' ' || r == 0x7f {
				t.Fatalf("%q accepted with a control character: %q", body, text)
			}
		}
	})
}

func TestEmptyBody(t *testing.T) {
	for body, ok := range map[string]bool{"": true, "  ": true, "{}": true, " { } ": true, `{"a":1}`: false, "[]": false, "{": false, "null": false} {
		if err := emptyBody([]byte(body)); (err == nil) != ok {
			t.Errorf("emptyBody(%q) = %v, want ok %v", body, err, ok)
		}
	}
}
