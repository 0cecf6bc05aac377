package events_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/events"
)

func TestSignatureVerifies(t *testing.T) {
	secret := []byte("s3cret")
	body := []byte(`{"version":1}`)
	at := time.Unix(1_800_000_000, 0)
	h := events.Sign(secret, at, body)
	if !strings.HasPrefix(h, "t=1800000000,v1=") {
		t.Fatalf("Sign = %q, want t=1800000000,v1=…", h)
	}
	got, err := events.Verify(secret, h, body, at.Add(4*time.Minute), 5*time.Minute)
	if err != nil || !got.Equal(at) {
		t.Fatalf("Verify = %v, %v; want %v, nil", got, err, at)
	}
	other := events.Sign([]byte("old"), at, body)
	rotated := h + "," + strings.Split(other, ",")[1]
	if _, err := events.Verify(secret, rotated, body, at, time.Minute); err != nil {
		t.Errorf("two v1 parts, one matching: %v", err)
	}
	cases := []struct {
		name   string
		secret string
		header string
		body   string
		now    time.Time
		want   error
	}{
		{"other body", "s3cret", h, `{"version":2}`, at, events.ErrSignatureMismatch},
		{"other secret", "wrong", h, string(body), at, events.ErrSignatureMismatch},
		{"too old", "s3cret", h, string(body), at.Add(6 * time.Minute), events.ErrSignatureStale},
		{"from the future", "s3cret", h, string(body), at.Add(-6 * time.Minute), events.ErrSignatureStale},
		{"stale and forged", "wrong", h, string(body), at.Add(time.Hour), events.ErrSignatureMismatch},
		{"empty", "s3cret", "", string(body), at, events.ErrSignatureMalformed},
		{"no t", "s3cret", strings.Split(h, ",")[1], string(body), at, events.ErrSignatureMalformed},
		{"no v1", "s3cret", "t=1800000000", string(body), at, events.ErrSignatureMalformed},
		{"two t", "s3cret", "t=1," + h, string(body), at, events.ErrSignatureMalformed},
		{"signed t", "s3cret", strings.Replace(h, "t=", "t=-", 1), string(body), at, events.ErrSignatureMalformed},
		{"short v1", "s3cret", "t=1800000000,v1=abcd", string(body), at, events.ErrSignatureMalformed},
		{"not hex", "s3cret", "t=1800000000,v1=" + strings.Repeat("zz", 32), string(body), at, events.ErrSignatureMalformed},
		{"huge", "s3cret", h + "," + strings.Repeat("x=y,", 400), string(body), at, events.ErrSignatureMalformed},
		{"changed t", "s3cret", strings.Replace(h, "t=1800000000", "t=1800000001", 1), string(body), at, events.ErrSignatureMismatch},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := events.Verify([]byte(c.secret), c.header, []byte(c.body), c.now, 5*time.Minute)
			if !errors.Is(err, c.want) {
				t.Errorf("Verify(%q) = %v, want %v", c.header, err, c.want)
			}
		})
	}
}

// TestSignatureForVerifies: a SignFor header verifies for its id only, and
// never as a plain Sign header or the other way round.
func TestSignatureForVerifies(t *testing.T) {
	secret := []byte("s3cret")
	body := []byte(`{"paymentId":"pi_1"}`)
	at := time.Unix(1_800_000_000, 0)
	const id = "0b8f9c52-8c1e-4f7e-9a51-3f6f2f1c9d10"
	h := events.SignFor(secret, at, id, body)
	if got, err := events.VerifyFor(secret, h, id, body, at, 5*time.Minute); err != nil || !got.Equal(at) {
		t.Fatalf("VerifyFor = %v, %v; want %v, nil", got, err, at)
	}
	cases := []struct {
		name   string
		header string
		id     string
		body   string
	}{
		{"other id", h, "0b8f9c52-8c1e-4f7e-9a51-3f6f2f1c9d11", string(body)},
		{"no id", h, "", string(body)},
		{"id moved into the body", h, "0b8f9c52-8c1e-4f7e-9a51-3f6f2f1c9d10.x", string(body)},
		{"unbound signature", events.Sign(secret, at, body), id, string(body)},
		{"id and body split elsewhere", events.SignFor(secret, at, "a", []byte("b.c")), "a.b", "c"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := events.VerifyFor(secret, c.header, c.id, []byte(c.body), at, 5*time.Minute); !errors.Is(err, events.ErrSignatureMismatch) {
				t.Errorf("VerifyFor(%q, %q) = %v, want a mismatch", c.header, c.id, err)
			}
		})
	}
	if _, err := events.Verify(secret, h, body, at, 5*time.Minute); !errors.Is(err, events.ErrSignatureMismatch) {
		t.Errorf("a bound signature verified unbound: %v", err)
	}
}

// FuzzVerify feeds arbitrary headers and bodies: Verify never panics, and
// accepts only what Sign made for that body.
func FuzzVerify(f *testing.F) {
	secret := []byte("s3cret")
	at := time.Unix(1_800_000_000, 0)
	f.Add(events.Sign(secret, at, []byte("{}")), []byte("{}"))
	f.Add("t=1800000000,v1=00", []byte(""))
	f.Add("t=,v1=", []byte("x"))
	f.Add(",,,", []byte("x"))
	f.Add("t=1800000000,v0=ab,v1="+strings.Repeat("0", 64), []byte("x"))
	f.Fuzz(func(t *testing.T, header string, body []byte) {
		signed, err := events.Verify(secret, header, body, at, 5*time.Minute)
		if err == nil {
			want := strings.Split(events.Sign(secret, signed, body), ",")[1]
			if !strings.Contains(strings.ToLower(header), want) {
				t.Fatalf("accepted %q for %q without its signature %s", header, body, want)
			}
		}
		if err != nil && !errors.Is(err, events.ErrSignatureMalformed) && !errors.Is(err, events.ErrSignatureMismatch) && !errors.Is(err, events.ErrSignatureStale) {
			t.Fatalf("unexpected error %v", err)
		}
	})
}

// FuzzVerifyFor feeds arbitrary headers, ids and bodies to the bound form:
// it never panics, and accepts only what SignFor made for that id and
// body.
func FuzzVerifyFor(f *testing.F) {
	secret := []byte("s3cret")
	at := time.Unix(1_800_000_000, 0)
	const id = "0b8f9c52-8c1e-4f7e-9a51-3f6f2f1c9d10"
	f.Add(events.SignFor(secret, at, id, []byte("{}")), id, []byte("{}"))
	f.Add(events.SignFor(secret, at, "a", []byte("b.c")), "a.b", []byte("c"))
	f.Add(events.Sign(secret, at, []byte("{}")), "", []byte("{}"))
	f.Add("t=1800000000,v1="+strings.Repeat("0", 64), id, []byte("x"))
	f.Fuzz(func(t *testing.T, header, id string, body []byte) {
		signed, err := events.VerifyFor(secret, header, id, body, at, 5*time.Minute)
		if err == nil {
			want := strings.Split(events.SignFor(secret, signed, id, body), ",")[1]
			if id == "" || strings.Contains(id, ".") || !strings.Contains(strings.ToLower(header), want) {
				t.Fatalf("accepted %q for id %q and %q without its signature %s", header, id, body, want)
			}
		}
		if err != nil && !errors.Is(err, events.ErrSignatureMalformed) && !errors.Is(err, events.ErrSignatureMismatch) && !errors.Is(err, events.ErrSignatureStale) {
			t.Fatalf("unexpected error %v", err)
		}
	})
}
