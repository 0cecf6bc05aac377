package events

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"
)

// SignatureHeader carries the signature of a webhook request and of a
// provider's payment callback: "t=<unix seconds>,v1=<hex HMAC-SHA256>".
const SignatureHeader = "X-Flashsale-Signature"

// Signature errors. Verify returns one of them, so a caller can tell a
// malformed header from a wrong signature and from a stale timestamp.
var (
	ErrSignatureMalformed = errors.New("signature header malformed")
	ErrSignatureMismatch  = errors.New("signature does not match")
	ErrSignatureStale     = errors.New("signature timestamp outside the allowed window")
)

// MinSecretBytes is the shortest signing secret accepted: a key any
// shorter could be searched for offline from one signed request.
const MinSecretBytes = 32

// maxSignatureHeader bounds what Verify parses: a header far longer than
// any real signature is refused before any work.
const maxSignatureHeader = 1024

// Sign returns the signature header value of body sent at t: the HMAC-SHA256
// under secret of "<unix seconds>.<body>", in hex. The timestamp is inside
// the signed text, so a captured request cannot be replayed with a fresh
// one.
func Sign(secret []byte, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac(secret, ts, "", body))
}

// SignFor is Sign bound to a resource, the order id of a payment callback:
// the HMAC of "<unix seconds>.<id>.<body>", so a signed request is
// refused on any other resource. id must be neither empty nor contain a
// dot, so the signed text splits one way only.
func SignFor(secret []byte, t time.Time, id string, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac(secret, ts, id, body))
}

// mac is the HMAC-SHA256 of "<ts>.<body>", or of "<ts>.<id>.<body>" when
// id is not empty.
func mac(secret []byte, ts, id string, body []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	if id != "" {
		m.Write([]byte(id))
		m.Write([]byte{'.'})
	}
	m.Write(body)
	return m.Sum(nil)
}

// Verify checks header (a Sign value) against body, secret and the clock:
// the timestamp must be within window of now, either way (clocks drift), and
// one v1 signature must match, compared in constant time. Several v1 parts
// are allowed so a sender can sign with an old and a new secret while the
// secret is rotated; parts of other names are ignored. It returns the
// signed time.
func Verify(secret []byte, header string, body []byte, now time.Time, window time.Duration) (time.Time, error) {
	return verify(secret, header, "", body, now, window)
}

// VerifyFor is Verify of a SignFor header bound to id; an empty id, or
// one with a dot, never verifies.
func VerifyFor(secret []byte, header, id string, body []byte, now time.Time, window time.Duration) (time.Time, error) {
	if id == "" || strings.Contains(id, ".") {
		return time.Time{}, ErrSignatureMismatch
	}
	return verify(secret, header, id, body, now, window)
}

func verify(secret []byte, header, id string, body []byte, now time.Time, window time.Duration) (time.Time, error) {
	if len(header) > maxSignatureHeader {
		return time.Time{}, ErrSignatureMalformed
	}
	var ts string
	var sigs [][]byte
	for part := range strings.SplitSeq(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return time.Time{}, ErrSignatureMalformed
		}
		switch k {
		case "t":
			if ts != "" || v == "" || len(v) > 12 || strings.TrimLeft(v, "0123456789") != "" {
				return time.Time{}, ErrSignatureMalformed
			}
			ts = v
		case "v1":
			b, err := hex.DecodeString(v)
			if err != nil || len(b) != sha256.Size {
				return time.Time{}, ErrSignatureMalformed
			}
			sigs = append(sigs, b)
		}
	}
	if ts == "" || len(sigs) == 0 {
		return time.Time{}, ErrSignatureMalformed
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return time.Time{}, ErrSignatureMalformed
	}
	at := time.Unix(sec, 0)
	want := mac(secret, ts, id, body)
	matched := false
	for _, s := range sigs {
		matched = matched || hmac.Equal(s, want)
	}
	if !matched {
		return time.Time{}, ErrSignatureMismatch
	}
	// Checked after the signature, so that a stale error tells only of
	// an authentic request.
	if d := now.Sub(at); d > window || d < -window {
		return at, ErrSignatureStale
	}
	return at, nil
}
