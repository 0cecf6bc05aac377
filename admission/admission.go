// Package admission signs and verifies the admission tokens the waiting room
// hands out and the purchase path checks on every request.
//
// A token is base64url (no padding) of 50 bytes:
//
//	version(1)=2 | keyID(1) | userID(8) | saleID(8) | expiresAtMs(8) | notBeforeMs(8) | HMAC-SHA256(first 34 bytes)[:16]
//
// A token is valid from notBefore (0: at once) until expiresAt, so the
// first wave of a sale can be admitted before the opening with tokens
// that buy only from the opening instant. Version 1 tokens (42 bytes, no
// notBefore) still verify, so tokens issued before an upgrade keep working
// for their life; every new token is version 2.
//
// Verification decodes into a stack buffer and computes one HMAC with a
// pooled hash, so it allocates nothing on the happy path. Keys carry a
// one-byte id, so a new key can sign while old ones still verify.
package admission

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"hash"
	"sync"
	"time"

	"github.com/flashsale/flashsale"
)

const (
	version    = 2
	bodyLen    = 34
	macLen     = 16
	rawLen     = bodyLen + macLen
	encodedLen = (rawLen*8 + 5) / 6 // 67

	// version 1: the same without notBeforeMs
	v1BodyLen    = 26
	v1RawLen     = v1BodyLen + macLen
	v1EncodedLen = (v1RawLen*8 + 5) / 6 // 56
)

// strict decodes refusing non-zero padding bits: a 50-byte token leaves two
// bits over, and one token must have one spelling.
var strict = base64.RawURLEncoding.Strict()

// Key is one signing key.
type Key struct {
	ID     byte
	Secret []byte
}

// scratch is a pooled HMAC with buffers, so verification does not allocate
// (buffers passed to hash.Hash methods would escape to the heap).
type scratch struct {
	h   hash.Hash
	enc [encodedLen]byte
	raw [rawLen]byte
	sum [sha256.Size]byte
}

type verifier struct {
	pool sync.Pool // of *scratch
}

func (v *verifier) get() *scratch { return v.pool.Get().(*scratch) }

// Signer signs with its current key and verifies with any of its keys.
type Signer struct {
	current byte
	keys    [256]*verifier
}

// NewSigner returns a signer that signs with keys[0] and verifies with all.
func NewSigner(keys ...Key) (*Signer, error) {
	if len(keys) == 0 {
		return nil, errors.New("admission.NewSigner: no key")
	}
	s := &Signer{current: keys[0].ID}
	for _, k := range keys {
		if len(k.Secret) < 16 {
			return nil, errors.New("admission.NewSigner: key shorter than 16 bytes")
		}
		secret := append([]byte(nil), k.Secret...)
		s.keys[k.ID] = &verifier{pool: sync.Pool{New: func() any { return &scratch{h: hmac.New(sha256.New, secret)} }}}
	}
	return s, nil
}

var errNotAdmitted = &flashsale.Error{Code: flashsale.CodeNotAdmitted, Message: "no valid admission token for this sale; join the waiting room"}

// ErrNotAdmitted is the error of every refused token.
func ErrNotAdmitted() error { return errNotAdmitted }

// macInto computes the MAC of the first body bytes of sc.raw into sc.sum.
func macInto(sc *scratch, body int) []byte {
	sc.h.Reset()
	sc.h.Write(sc.raw[:body])
	return sc.h.Sum(sc.sum[:0])[:macLen]
}

// Sign returns the token for a.
func (s *Signer) Sign(a flashsale.Admission) string {
	v := s.keys[s.current]
	sc := v.get()
	defer v.pool.Put(sc)
	sc.raw[0] = version
	sc.raw[1] = s.current
	binary.BigEndian.PutUint64(sc.raw[2:], uint64(a.UserID))
	binary.BigEndian.PutUint64(sc.raw[10:], uint64(a.SaleID))
	binary.BigEndian.PutUint64(sc.raw[18:], uint64(a.ExpiresAt.UnixMilli()))
	var nb int64
	if !a.NotBefore.IsZero() {
		nb = a.NotBefore.UnixMilli()
	}
	binary.BigEndian.PutUint64(sc.raw[26:], uint64(nb))
	copy(sc.raw[bodyLen:], macInto(sc, bodyLen))
	return base64.RawURLEncoding.EncodeToString(sc.raw[:])
}

// Parse checks the token's form and signature and returns what it asserts,
// without checking expiry or binding.
func (s *Signer) Parse(token string) (flashsale.Admission, error) {
	ver, body, raw := byte(version), bodyLen, rawLen
	switch len(token) {
	case encodedLen:
	case v1EncodedLen:
		ver, body, raw = 1, v1BodyLen, v1RawLen
	default:
		return flashsale.Admission{}, errNotAdmitted
	}
	// The key id is the second byte; decode the first 4 characters to find it.
	var head [3]byte
	if _, err := base64.RawURLEncoding.Decode(head[:], []byte(token[:4])); err != nil {
		return flashsale.Admission{}, errNotAdmitted
	}
	v := s.keys[head[1]]
	if v == nil || head[0] != ver {
		return flashsale.Admission{}, errNotAdmitted
	}
	sc := v.get()
	defer v.pool.Put(sc)
	n := copy(sc.enc[:], token)
	m, err := strict.Decode(sc.raw[:], sc.enc[:n])
	if err != nil || m != raw {
		return flashsale.Admission{}, errNotAdmitted
	}
	if !hmac.Equal(macInto(sc, body), sc.raw[body:raw]) {
		return flashsale.Admission{}, errNotAdmitted
	}
	a := flashsale.Admission{
		UserID:    int64(binary.BigEndian.Uint64(sc.raw[2:])),
		SaleID:    int64(binary.BigEndian.Uint64(sc.raw[10:])),
		ExpiresAt: time.UnixMilli(int64(binary.BigEndian.Uint64(sc.raw[18:]))),
	}
	if ver == version {
		if nb := int64(binary.BigEndian.Uint64(sc.raw[26:])); nb != 0 {
			a.NotBefore = time.UnixMilli(nb)
		}
	}
	return a, nil
}

// Verify accepts the token only when it is genuine, valid at now (not
// before its notBefore, before its expiry), and bound to this user and
// sale. Every refusal is NOT_ADMITTED.
func (s *Signer) Verify(token string, userID, saleID int64, now time.Time) (flashsale.Admission, error) {
	a, err := s.Parse(token)
	if err != nil {
		return a, err
	}
	if a.UserID != userID || a.SaleID != saleID || !now.Before(a.ExpiresAt) || now.Before(a.NotBefore) {
		return flashsale.Admission{}, errNotAdmitted
	}
	return a, nil
}
