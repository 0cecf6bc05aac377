// Package admission signs and verifies the admission tokens the waiting room
// hands out and the purchase path checks on every request.
//
// A token is base64url (no padding) of 42 bytes:
//
//	version(1)=1 | keyID(1) | userID(8) | saleID(8) | expiresAtMs(8) | HMAC-SHA256(first 26 bytes)[:16]
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
	version    = 1
	bodyLen    = 26
	macLen     = 16
	rawLen     = bodyLen + macLen
	encodedLen = (rawLen*8 + 5) / 6 // 56
)

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

// macInto computes the MAC of sc.raw's body into sc.sum.
func macInto(sc *scratch) []byte {
	sc.h.Reset()
	sc.h.Write(sc.raw[:bodyLen])
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
	copy(sc.raw[bodyLen:], macInto(sc))
	return base64.RawURLEncoding.EncodeToString(sc.raw[:])
}

// Parse checks the token's form and signature and returns what it asserts,
// without checking expiry or binding.
func (s *Signer) Parse(token string) (flashsale.Admission, error) {
	if len(token) != encodedLen {
		return flashsale.Admission{}, errNotAdmitted
	}
	// The key id is the second byte; decode the first 4 characters to find it.
	var head [3]byte
	if _, err := base64.RawURLEncoding.Decode(head[:], []byte(token[:4])); err != nil {
		return flashsale.Admission{}, errNotAdmitted
	}
	v := s.keys[head[1]]
	if v == nil || head[0] != version {
		return flashsale.Admission{}, errNotAdmitted
	}
	sc := v.get()
	defer v.pool.Put(sc)
	copy(sc.enc[:], token)
	n, err := base64.RawURLEncoding.Decode(sc.raw[:], sc.enc[:])
	if err != nil || n != rawLen {
		return flashsale.Admission{}, errNotAdmitted
	}
	if !hmac.Equal(macInto(sc), sc.raw[bodyLen:]) {
		return flashsale.Admission{}, errNotAdmitted
	}
	return flashsale.Admission{
		UserID:    int64(binary.BigEndian.Uint64(sc.raw[2:])),
		SaleID:    int64(binary.BigEndian.Uint64(sc.raw[10:])),
		ExpiresAt: time.UnixMilli(int64(binary.BigEndian.Uint64(sc.raw[18:]))),
	}, nil
}

// Verify accepts the token only when it is genuine, unexpired at now, and
// bound to this user and sale. Every refusal is NOT_ADMITTED.
func (s *Signer) Verify(token string, userID, saleID int64, now time.Time) (flashsale.Admission, error) {
	a, err := s.Parse(token)
	if err != nil {
		return a, err
	}
	if a.UserID != userID || a.SaleID != saleID || !now.Before(a.ExpiresAt) {
		return flashsale.Admission{}, errNotAdmitted
	}
	return a, nil
}
