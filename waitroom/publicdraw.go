package waitroom

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"strings"

	"github.com/flashsale/flashsale"
)

// The public draw record (GET /api/flash-sales/sales/{saleId}/draw,
// docs/DRAW.md) is what anyone needs to recompute a sale's draw without
// access to Redis: the seed, the commitment, the pre-queue size and, for
// every pre-queue ticket in ticket order, a tag of its holder.

// DrawRecordVersion is the version of the record's format. Version 2
// derives member tags from the members' secrets. A draw by tier is
// recorded as version 3 (TieredDrawVersion), the same record with each
// member's tier: a verifier that reads only version 2 refuses it instead
// of computing wrong places.
const (
	DrawRecordVersion = 2
	TieredDrawVersion = 3
)

// memberLabel separates member tags from every other use of the seed.
const memberLabel = "flashsale/draw/member/v2"

// secretLabel separates member secrets from every other use of the draw
// key.
const secretLabel = "flashsale/draw/secret/v1"

// memberTagBytes is the length of a member tag before hex encoding: 128
// bits keep tags of distinct users apart in any queue (a collision among a
// million members has odds below 2^-88) at half the body of a full digest.
const memberTagBytes = 16

// MemberSecretBytes is the length of a member secret before hex encoding.
const MemberSecretBytes = 16

// DrawRecord is the public draw record.
type DrawRecord struct {
	Version    int    `json:"version"`
	SaleID     int64  `json:"saleId"`
	Seed       string `json:"seed"`
	Commitment string `json:"commitment"`
	// PreQueueSize is n, the number of tickets drawn.
	PreQueueSize int64 `json:"preQueueSize"`
	// Members[i] is the member tag of the holder of pre-queue ticket i, ""
	// for a ticket nobody could name after a Redis loss (docs/DRAW.md).
	Members []string `json:"members"`
	// Tiers (version 3, a draw by tier) holds a digit per member: the
	// tier ticket i's holder joined with, '0' for none.
	Tiers string `json:"tiers,omitempty"`
}

// MemberSecret is userID's secret in sale saleID: the first 16 bytes of
// HMAC-SHA256(key, "flashsale/draw/secret/v1" || saleID || userID, both 8
// bytes big-endian). Derived, not stored: a shopper who joins again, on
// any gateway, gets the same secret. Only the shopper (in the join
// status) and the gateways know it.
func MemberSecret(key []byte, saleID, userID int64) [MemberSecretBytes]byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(secretLabel))
	var buf [16]byte
	binary.BigEndian.PutUint64(buf[:8], uint64(saleID))
	binary.BigEndian.PutUint64(buf[8:], uint64(userID))
	m.Write(buf[:])
	var out [MemberSecretBytes]byte
	copy(out[:], m.Sum(nil))
	return out
}

// MemberSecret is userID's secret in the sale, hex, as the join status
// carries it.
func (r *Room) MemberSecret(saleID, userID int64) string {
	s := MemberSecret(r.cfg.DrawKey, saleID, userID)
	return hex.EncodeToString(s[:])
}

// ParseMemberSecret reads a member secret: 32 hex characters (either
// case).
func ParseMemberSecret(s string) ([MemberSecretBytes]byte, error) {
	var out [MemberSecretBytes]byte
	if len(s) != 2*MemberSecretBytes {
		return out, fmt.Errorf("a member secret is %d hex characters, not %d", 2*MemberSecretBytes, len(s))
	}
	if _, err := hex.Decode(out[:], []byte(s)); err != nil {
		return out, errors.New("a member secret is hex characters only")
	}
	return out, nil
}

// MemberTag is the tag that stands for userID, holding secret, in sale
// saleID's public draw record: the first 16 bytes, hex, of
// HMAC-SHA256(key = seed, msg = "flashsale/draw/member/v2" || saleID ||
// userID (both 8 bytes big-endian) || secret (16 bytes)). Keyed by the
// seed, tags can not be computed before the seed is published; with the
// member's secret in the message, nobody who knows only user ids can
// compute a tag or link a tag to a user id, after the draw either.
func MemberTag(seed []byte, saleID, userID int64, secret [MemberSecretBytes]byte) string {
	return newMemberTagger(seed, saleID).tag(userID, secret)
}

// memberTagger computes one sale's member tags with one HMAC state, reset
// between users: a record of a large queue computes a tag per member.
type memberTagger struct {
	mac    hash.Hash
	saleID int64
	buf    [16 + MemberSecretBytes]byte
	sum    [sha256.Size]byte
}

func newMemberTagger(seed []byte, saleID int64) *memberTagger {
	return &memberTagger{mac: hmac.New(sha256.New, seed), saleID: saleID}
}

func (m *memberTagger) tag(userID int64, secret [MemberSecretBytes]byte) string {
	m.mac.Reset()
	m.mac.Write([]byte(memberLabel))
	binary.BigEndian.PutUint64(m.buf[:8], uint64(m.saleID))
	binary.BigEndian.PutUint64(m.buf[8:16], uint64(userID))
	copy(m.buf[16:], secret[:])
	m.mac.Write(m.buf[:])
	return hex.EncodeToString(m.mac.Sum(m.sum[:0])[:memberTagBytes])
}

var errIncomplete = flashsale.Errorf(flashsale.CodeUnavailable, "the draw record is being restored; retry shortly")

var errNotDrawn = flashsale.Errorf(flashsale.CodeNotDrawn, "the pre-queue has not been drawn yet: the draw happens when the pre-queue closes")

// DrawRecord builds the sale's public draw record from Redis, a tag per
// member: the sale's leader builds it once, at the draw, and stores it
// (publishDraw); requests are served the stored bytes. NOT_DRAWN before the
// draw (DrawAt: the pre-queue's close, Config.DrawLead before the opening)
// by the room's clock or before its pre-queue is frozen. An
// incomplete pre-queue in Redis (lost, not yet restored) is UNAVAILABLE,
// so a partial record is never published.
func (r *Room) DrawRecord(ctx context.Context, sale *flashsale.Sale) (DrawRecord, error) {
	if now := r.cfg.Now(); now.Before(DrawAt(sale, r.cfg.DrawLead)) || len(sale.ShuffleSeed) == 0 {
		return DrawRecord{}, errNotDrawn
	}
	q, err := readDrawn(ctx, r.rdb, sale.ID)
	if err != nil {
		return DrawRecord{}, fmt.Errorf("waitroom.DrawRecord: %w", err)
	}
	if q.n < 0 {
		return DrawRecord{}, errNotDrawn
	}
	users, n := q.users, q.n
	if n != int64(len(users)) {
		// Redis lost part of the queue; the room restores it from the
		// checkpoint, so this passes.
		return DrawRecord{}, fmt.Errorf("waitroom.DrawRecord: sale %d: %d of %d pre-queue tickets in Redis: %w", sale.ID, len(users), n, errIncomplete)
	}
	rec := DrawRecord{
		Version:      DrawRecordVersion,
		SaleID:       sale.ID,
		Seed:         sale.SeedHex(),
		Commitment:   sale.ShuffleCommitment,
		PreQueueSize: int64(len(users)),
		Members:      make([]string, len(users)),
	}
	if q.tiered {
		rec.Version = TieredDrawVersion
		rec.Tiers = string(tierDigits(q.tiers, 0, len(users)))
	}
	tags := newMemberTagger(sale.ShuffleSeed, sale.ID)
	named := 0
	for i, u := range users {
		if u != 0 { // 0 marks a ticket nobody could name
			rec.Members[i] = tags.tag(u, MemberSecret(r.cfg.DrawKey, sale.ID, u))
			named++
		}
	}
	r.m.tags.Add(float64(named))
	return rec, nil
}

// ParseDrawRecord reads a public draw record of at most limit bytes and
// checks its form: the version, a 32-byte hex seed and commitment, a
// pre-queue size equal to the number of members, members that are tags or
// "", and no tag twice (one ticket per user). It does not check the
// commitment: CheckDrawRecord does.
func ParseDrawRecord(r io.Reader, limit int64) (DrawRecord, error) {
	lr := &io.LimitedReader{R: r, N: limit + 1}
	dec := json.NewDecoder(lr)
	var rec DrawRecord
	if err := dec.Decode(&rec); err != nil {
		if lr.N <= 0 {
			return DrawRecord{}, fmt.Errorf("waitroom.ParseDrawRecord: larger than %d bytes", limit)
		}
		return DrawRecord{}, fmt.Errorf("waitroom.ParseDrawRecord: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return DrawRecord{}, errors.New("waitroom.ParseDrawRecord: data after the record")
	}
	if lr.N <= 0 {
		return DrawRecord{}, fmt.Errorf("waitroom.ParseDrawRecord: larger than %d bytes", limit)
	}
	if err := rec.validate(); err != nil {
		return DrawRecord{}, fmt.Errorf("waitroom.ParseDrawRecord: %w", err)
	}
	return rec, nil
}

func (rec *DrawRecord) validate() error {
	switch rec.Version {
	case DrawRecordVersion:
		if rec.Tiers != "" {
			return errors.New("tiers in a version 2 record (a draw by tier is version 3)")
		}
	case TieredDrawVersion:
		if len(rec.Tiers) != len(rec.Members) {
			return fmt.Errorf("%d tiers for %d members", len(rec.Tiers), len(rec.Members))
		}
		for i := 0; i < len(rec.Tiers); i++ {
			if c := rec.Tiers[i]; c < '0' || c > '0'+flashsale.MaxTier {
				return fmt.Errorf("tier of member %d is not a digit 0 to %d", i, flashsale.MaxTier)
			}
		}
	default:
		return fmt.Errorf("version %d, this verifier reads %d and %d", rec.Version, DrawRecordVersion, TieredDrawVersion)
	}
	if rec.SaleID <= 0 {
		return fmt.Errorf("saleId %d is not a sale id", rec.SaleID)
	}
	if !isHex(rec.Seed, 64) {
		return errors.New("seed is not 64 hex characters")
	}
	if !isHex(rec.Commitment, 64) {
		return errors.New("commitment is not 64 hex characters")
	}
	if rec.PreQueueSize != int64(len(rec.Members)) {
		return fmt.Errorf("preQueueSize %d but %d members", rec.PreQueueSize, len(rec.Members))
	}
	seen := make(map[string]int, len(rec.Members))
	for i, m := range rec.Members {
		if m == "" {
			continue
		}
		if !isHex(m, 2*memberTagBytes) {
			return fmt.Errorf("member %d is not a tag of %d hex characters", i, 2*memberTagBytes)
		}
		if j, dup := seen[m]; dup {
			return fmt.Errorf("tickets %d and %d have the same holder", j, i)
		}
		seen[m] = i
	}
	return nil
}

// isHex reports whether s is n lowercase hex digits.
func isHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// DrawCheck is the draw recomputed from a public record.
type DrawCheck struct {
	// Order[place] is the pre-queue ticket drawn to that place.
	Order []int64
	// Places[ticket] is the place of each pre-queue ticket.
	Places []int64
}

// CheckDrawRecord checks a parsed record (ParseDrawRecord) against the
// commitment and recomputes every place with the room's draw (by tier for
// a version 3 record). It
// fails when the commitment is not the SHA-256 of the seed or when the
// places are not a permutation of [0, n).
func CheckDrawRecord(rec DrawRecord) (DrawCheck, error) {
	seed, err := hex.DecodeString(rec.Seed)
	if err != nil {
		return DrawCheck{}, fmt.Errorf("waitroom.CheckDrawRecord: seed: %w", err)
	}
	sum := sha256.Sum256(seed)
	if !strings.EqualFold(hex.EncodeToString(sum[:]), rec.Commitment) {
		return DrawCheck{}, errors.New("waitroom.CheckDrawRecord: the commitment is not the SHA-256 of the seed")
	}
	n := uint64(len(rec.Members))
	chk := DrawCheck{Order: make([]int64, n), Places: make([]int64, n)}
	if n == 0 {
		return chk, nil
	}
	for i := range chk.Order {
		chk.Order[i] = -1
	}
	p := NewDraw(seed, n, rec.Version == TieredDrawVersion, []byte(rec.Tiers))
	for i := range n {
		place := p.Place(i)
		if chk.Order[place] != -1 {
			return DrawCheck{}, fmt.Errorf("waitroom.CheckDrawRecord: tickets %d and %d drawn to place %d", chk.Order[place], i, place)
		}
		chk.Order[place], chk.Places[i] = int64(i), int64(place)
	}
	return chk, nil
}

// FindMember returns the pre-queue ticket of userID, holding secret (the
// join status's drawSecret), in rec, or false.
func (rec *DrawRecord) FindMember(userID int64, secret [MemberSecretBytes]byte) (int64, bool) {
	seed, err := hex.DecodeString(rec.Seed)
	if err != nil {
		return 0, false
	}
	tag := MemberTag(seed, rec.SaleID, userID, secret)
	for i, m := range rec.Members {
		if m == tag {
			return int64(i), true
		}
	}
	return 0, false
}
