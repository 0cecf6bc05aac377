package defense

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Proof of work (see POW.md). A challenge is stateless: the server signs
// salt, difficulty, expiry, user and sale with HMAC-SHA256. A solution is a
// nonce n such that SHA-256(salt || decimal(n)), read as a 256-bit
// big-endian number, is below threshold = floor(2^256 / difficulty), so the
// expected work is difficulty hashes. Single use is a Redis SET NX marker
// per salt that lives until the challenge has expired.

const (
	powAlgorithm   = "SHA-256"
	powSaltBytes   = 16
	powSaltHexLen  = 2 * powSaltBytes
	powMaxSolution = 1024 // bytes of solution JSON we look at
	powDomain      = "flashsale-pow-v1"
	// powSpentPrefix is the Redis key prefix of spent-challenge markers:
	// fs:pow:spent:<salt>, value "1", expiring after the challenge.
	powSpentPrefix = "fs:pow:spent:"
	// powSpentMargin keeps a spent marker past the challenge's expiry, to
	// cover clock differences between gateways.
	powSpentMargin = 30 * time.Second
	// DefaultPowTTL is how long a challenge may be solved.
	DefaultPowTTL = 2 * time.Minute
)

// powChallenge is the challenge message sent to the client.
type powChallenge struct {
	Type        string `json:"type"`
	Algorithm   string `json:"algorithm"`
	Salt        string `json:"salt"`
	Difficulty  uint64 `json:"difficulty"`
	Threshold   string `json:"threshold"`
	ExpiresAtMs int64  `json:"expiresAtMs"`
	Signature   string `json:"signature"`
}

// powSolution is what the client sends back in join.pow: the challenge's
// fields (extra ones such as type and threshold are ignored) plus nonce.
type powSolution struct {
	Algorithm   string `json:"algorithm"`
	Salt        string `json:"salt"`
	Difficulty  uint64 `json:"difficulty"`
	ExpiresAtMs int64  `json:"expiresAtMs"`
	Signature   string `json:"signature"`
	Nonce       uint64 `json:"nonce"`
}

// Reasons a solution is refused.
var (
	errPowMalformed  = errors.New("pow: malformed solution")
	errPowDifficulty = errors.New("pow: difficulty below the current one")
	errPowExpired    = errors.New("pow: challenge expired")
	errPowSignature  = errors.New("pow: bad signature (forged, or another user or sale)")
	errPowHash       = errors.New("pow: hash not below threshold")
	errPowSpent      = errors.New("pow: challenge already used")
)

// powThreshold returns floor(2^256 / difficulty) as 32 big-endian bytes;
// difficulty 0 or 1 gives 2^256 - 1 (every hash passes, bar one).
func powThreshold(difficulty uint64) [32]byte {
	var out [32]byte
	if difficulty <= 1 {
		for i := range out {
			out[i] = 0xff
		}
		return out
	}
	t := new(big.Int).Lsh(big.NewInt(1), 256)
	t.Quo(t, new(big.Int).SetUint64(difficulty))
	t.FillBytes(out[:])
	return out
}

// powHash computes SHA-256(salt || decimal(nonce)) without allocating.
func powHash(salt string, nonce uint64) [32]byte {
	var buf [powSaltHexLen + 20]byte
	b := append(buf[:0], salt...)
	b = strconv.AppendUint(b, nonce, 10)
	return sha256.Sum256(b)
}

// powSign computes the challenge signature: HMAC-SHA256 over a fixed layout
// of every bound field.
func powSign(key []byte, salt string, difficulty uint64, expiresAtMs, userID, saleID int64) [32]byte {
	mac := hmac.New(sha256.New, key)
	var buf [len(powDomain) + 1 + powSaltHexLen + 32]byte
	b := append(buf[:0], powDomain...)
	b = append(b, 0)
	b = append(b, salt...)
	b = binary.BigEndian.AppendUint64(b, difficulty)
	b = binary.BigEndian.AppendUint64(b, uint64(expiresAtMs))
	b = binary.BigEndian.AppendUint64(b, uint64(userID))
	b = binary.BigEndian.AppendUint64(b, uint64(saleID))
	mac.Write(b)
	var sum [32]byte
	mac.Sum(sum[:0])
	return sum
}

// newPowChallenge signs a fresh challenge for userID in saleID.
func newPowChallenge(key []byte, difficulty uint64, userID, saleID int64, expiresAt time.Time) (json.RawMessage, error) {
	var saltRaw [powSaltBytes]byte
	if _, err := rand.Read(saltRaw[:]); err != nil {
		return nil, fmt.Errorf("defense: pow salt: %w", err)
	}
	salt := hex.EncodeToString(saltRaw[:])
	exp := expiresAt.UnixMilli()
	sig := powSign(key, salt, difficulty, exp, userID, saleID)
	th := powThreshold(difficulty)
	b, err := json.Marshal(powChallenge{
		Type:        "challenge",
		Algorithm:   powAlgorithm,
		Salt:        salt,
		Difficulty:  difficulty,
		Threshold:   hex.EncodeToString(th[:]),
		ExpiresAtMs: exp,
		Signature:   hex.EncodeToString(sig[:]),
	})
	if err != nil {
		return nil, fmt.Errorf("defense: pow challenge: %w", err)
	}
	return b, nil
}

// parsePowSolution decodes and checks the form of a solution.
func parsePowSolution(raw []byte) (powSolution, error) {
	var s powSolution
	if len(raw) == 0 || len(raw) > powMaxSolution {
		return s, errPowMalformed
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return s, errPowMalformed
	}
	if s.Algorithm != powAlgorithm || !isLowerHex(s.Salt, powSaltHexLen) || !isLowerHex(s.Signature, 2*sha256.Size) || s.Difficulty == 0 {
		return s, errPowMalformed
	}
	return s, nil
}

func isLowerHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// checkPowSolution verifies everything but single use: form, difficulty at
// least minDifficulty, expiry, signature (binds user and sale) and the hash.
func checkPowSolution(key []byte, raw []byte, minDifficulty uint64, userID, saleID int64, now time.Time) (powSolution, error) {
	s, err := parsePowSolution(raw)
	if err != nil {
		return s, err
	}
	if s.Difficulty < minDifficulty || s.Difficulty > maxDifficulty {
		return s, errPowDifficulty
	}
	if now.UnixMilli() >= s.ExpiresAtMs {
		return s, errPowExpired
	}
	var got [32]byte
	if _, err := hex.Decode(got[:], []byte(s.Signature)); err != nil {
		return s, errPowMalformed
	}
	want := powSign(key, s.Salt, s.Difficulty, s.ExpiresAtMs, userID, saleID)
	if !hmac.Equal(got[:], want[:]) {
		return s, errPowSignature
	}
	h := powHash(s.Salt, s.Nonce)
	th := powThreshold(s.Difficulty)
	if bytes.Compare(h[:], th[:]) >= 0 {
		return s, errPowHash
	}
	return s, nil
}

// spendPow marks a verified challenge used; errPowSpent if it already was.
func spendPow(ctx context.Context, rdb redis.UniversalClient, s powSolution, now time.Time) error {
	ttl := time.UnixMilli(s.ExpiresAtMs).Sub(now) + powSpentMargin
	ok, err := rdb.SetNX(ctx, powSpentPrefix+s.Salt, "1", ttl).Result()
	if err != nil {
		return fmt.Errorf("defense: pow spent marker: %w", err)
	}
	if !ok {
		return errPowSpent
	}
	return nil
}

// SolvePow solves a challenge message ({"type":"challenge",...}) and returns
// the solution to send as join.pow. It is the reference solver for tests and
// the load tool; expect difficulty hashes of work on one core
// (BenchmarkSolvePow).
func SolvePow(challenge json.RawMessage) (json.RawMessage, error) {
	var c powChallenge
	if err := json.Unmarshal(challenge, &c); err != nil {
		return nil, fmt.Errorf("defense.SolvePow: %w", err)
	}
	if c.Algorithm != powAlgorithm || !isLowerHex(c.Salt, powSaltHexLen) || c.Difficulty == 0 || c.Difficulty > maxDifficulty {
		return nil, fmt.Errorf("defense.SolvePow: %w", errPowMalformed)
	}
	nonce, err := solve(c.Salt, c.Difficulty)
	if err != nil {
		return nil, fmt.Errorf("defense.SolvePow: %w", err)
	}
	b, err := json.Marshal(powSolution{
		Algorithm:   c.Algorithm,
		Salt:        c.Salt,
		Difficulty:  c.Difficulty,
		ExpiresAtMs: c.ExpiresAtMs,
		Signature:   c.Signature,
		Nonce:       nonce,
	})
	if err != nil {
		return nil, fmt.Errorf("defense.SolvePow: %w", err)
	}
	return b, nil
}

// solve searches nonces 0, 1, 2, ... The chance of not finding one within
// 64 × difficulty tries is e^-64.
func solve(salt string, difficulty uint64) (uint64, error) {
	th := powThreshold(difficulty)
	limit := difficulty * 64
	if limit < difficulty { // overflow; cannot happen below maxDifficulty
		limit = ^uint64(0)
	}
	for n := uint64(0); n < limit; n++ {
		h := powHash(salt, n)
		if bytes.Compare(h[:], th[:]) < 0 {
			return n, nil
		}
	}
	return 0, errors.New("no nonce found")
}
