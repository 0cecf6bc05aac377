package auth

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"hash"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/flashsale/flashsale"
)

// verdict is what the HS256 fast path made of a token.
type verdict int8

const (
	fallBack verdict = iota // not understood: the golang-jwt path decides
	accept
	refuse
)

// decodeSegment decodes a segment as golang-jwt's parser does as verify
// configures it (neither WithPaddingAllowed nor WithStrictDecoding), so
// that both paths read the same bytes from the same text.
func decodeSegment(dst, seg []byte) (int, error) {
	return base64.RawURLEncoding.Decode(dst, seg)
}

// maxHeaderSeg bounds the header segment the fast path decodes: longer
// than any header isHS256Header accepts, encoded.
const maxHeaderSeg = 64

// hs256State is one verification's scratch space, pooled so a token costs
// no allocation: the token's bytes (the MAC is written from them), then
// the decoded signature and payload.
type hs256State struct {
	mac hash.Hash
	tok [MaxTokenLen]byte
	out [MaxTokenLen / 4 * 3]byte
	sum [sha256.Size]byte
}

func (v *Verifier) newHS256State() any {
	return &hs256State{mac: hmac.New(sha256.New, v.hmacKey)}
}

// verifyHS256 verifies a token of the HMAC secret with a fixed header and
// a fixed claim set without golang-jwt: the signature is checked before the
// payload is decoded, and the payload is read by parseClaims. It accepts
// and refuses only what verifyJWT accepts and refuses, with the same
// principal and expiry; anything else falls back.
func (v *Verifier) verifyHS256(token string) (flashsale.Principal, time.Time, verdict) {
	if len(v.hmacKey) == 0 || len(token) > MaxTokenLen {
		return flashsale.Principal{}, time.Time{}, fallBack
	}
	h, rest, ok := strings.Cut(token, ".")
	if !ok || len(h) > maxHeaderSeg {
		return flashsale.Principal{}, time.Time{}, fallBack
	}
	payload, sig, ok := strings.Cut(rest, ".")
	if !ok || strings.IndexByte(sig, '.') >= 0 {
		return flashsale.Principal{}, time.Time{}, fallBack
	}
	var hseg [maxHeaderSeg]byte
	var hdr [maxHeaderSeg / 4 * 3]byte
	n, err := decodeSegment(hdr[:], hseg[:copy(hseg[:], h)])
	if err != nil || !isHS256Header(hdr[:n]) {
		return flashsale.Principal{}, time.Time{}, fallBack
	}

	// From here golang-jwt refuses any token whose signature is not the
	// secret's MAC of the first two segments, whatever they hold.
	st := v.hs256.Get().(*hs256State)
	defer v.hs256.Put(st)
	tok := st.tok[:copy(st.tok[:], token)]
	signed := tok[:len(h)+1+len(payload)]
	st.mac.Reset()
	st.mac.Write(signed)
	mac := st.mac.Sum(st.sum[:0])
	n, err = decodeSegment(st.out[:], tok[len(signed)+1:])
	if err != nil || !hmac.Equal(st.out[:n], mac) {
		return flashsale.Principal{}, time.Time{}, refuse
	}

	n, err = decodeSegment(st.out[:], tok[len(h)+1:len(signed)])
	if err != nil {
		return flashsale.Principal{}, time.Time{}, fallBack
	}
	c, ok := parseClaims(st.out[:n])
	if !ok {
		return flashsale.Principal{}, time.Time{}, fallBack
	}
	p, exp, err := v.admit(c)
	if err != nil {
		return flashsale.Principal{}, time.Time{}, refuse
	}
	return p, exp, accept
}

// isHS256Header reports whether b is a header the fast path reads:
// golang-jwt's and Mint's, then two common spellings of other libraries.
// Any other header goes the golang-jwt way.
func isHS256Header(b []byte) bool {
	switch string(b) {
	case `{"alg":"HS256","typ":"JWT"}`, `{"typ":"JWT","alg":"HS256"}`, `{"alg":"HS256"}`:
		return true
	}
	return false
}

// parseClaims reads a JSON object of the claims sub, role, idk, exp, iat
// and nbf, each at most once, written the way JSON encoders write them: no
// whitespace, strings of printable ASCII without escapes, numbers without
// sign or exponent. ok is false on anything else, where encoding/json may
// read the object differently (unknown, differently cased or repeated
// keys, escapes, null, nested values): those fall back, never refuse.
func parseClaims(b []byte) (c claims, ok bool) {
	if len(b) < 2 || b[0] != '{' || b[len(b)-1] != '}' {
		return c, false
	}
	if len(b) == 2 {
		return c, true
	}
	const (
		seenSub = 1 << iota
		seenRole
		seenExp
		seenIat
		seenNbf
		seenIdk
	)
	var seen int
	for i := 1; ; {
		key, j, ok := scanString(b, i)
		if !ok || j >= len(b) || b[j] != ':' {
			return c, false
		}
		i = j + 1
		var bit int
		switch string(key) {
		case "sub", "role", "idk":
			var s []byte
			if s, i, ok = scanString(b, i); !ok {
				return c, false
			}
			switch key[0] {
			case 's':
				bit = seenSub
				c.sub, _ = parseSubject(s)
			case 'r':
				bit = seenRole
				c.operator = string(s) == "operator"
			default:
				bit = seenIdk
				c.idk = string(s)
			}
		case "exp", "iat", "nbf":
			j := i
			for j < len(b) && ('0' <= b[j] && b[j] <= '9' || b[j] == '.') {
				j++
			}
			t, ok := numericDate(b[i:j])
			if !ok {
				return c, false
			}
			i = j
			switch key[0] {
			case 'e':
				bit, c.exp, c.hasExp = seenExp, t, true
			case 'i':
				bit, c.iat, c.hasIat = seenIat, t, true
			default:
				bit, c.nbf, c.hasNbf = seenNbf, t, true
			}
		default:
			return c, false
		}
		if seen&bit != 0 {
			return c, false
		}
		seen |= bit
		switch {
		case i == len(b)-1: // the closing brace
			return c, true
		case b[i] == ',':
			i++
		default:
			return c, false
		}
	}
}

// scanString reads the string starting at b[i]: printable ASCII between
// quotes, no backslash. It returns the bytes inside and the index after.
func scanString(b []byte, i int) (s []byte, next int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, i, false
	}
	end := bytes.IndexByte(b[i+1:], '"')
	if end < 0 {
		return nil, i, false
	}
	s = b[i+1 : i+1+end]
	for _, ch := range s {
		if ch < 0x20 || ch > 0x7e || ch == '\\' {
			return nil, i, false
		}
	}
	return s, i + 2 + end, true
}

// maxDateDigits bounds the integer part of a date the fast path reads, so
// that it is exact as a float64 (golang-jwt reads dates as float64).
const maxDateDigits = 15

// numericDate reads a JSON number of digits and at most one fraction
// (no sign, no exponent, no leading zero) as golang-jwt's NumericDate
// does: through a float64, split into seconds and nanoseconds, truncated
// to jwt.TimePrecision.
func numericDate(b []byte) (time.Time, bool) {
	i := 0
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	if i == 0 || i > maxDateDigits || b[0] == '0' && i > 1 {
		return time.Time{}, false
	}
	if i == len(b) {
		var n int64
		for _, ch := range b {
			n = n*10 + int64(ch-'0')
		}
		return time.Unix(n, 0).Truncate(jwt.TimePrecision), true
	}
	if b[i] != '.' || i+1 == len(b) {
		return time.Time{}, false
	}
	for _, ch := range b[i+1:] {
		if ch < '0' || ch > '9' {
			return time.Time{}, false
		}
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return time.Time{}, false
	}
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(frac*1e9)).Truncate(jwt.TimePrecision), true
}
