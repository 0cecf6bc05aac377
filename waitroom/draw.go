package waitroom

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/lua"
)

// The draw orders the pre-queue: pre-queue ticket i (0-based, in the order
// tickets were handed out) gets place Permute(seed, n, i) among the n
// pre-queue tickets. docs/DRAW.md describes the construction so that anyone
// can recompute it; the description and this code must stay in step.

// drawRounds is the number of Feistel rounds.
const drawRounds = 8

// drawLabel separates the draw's key derivation from any other use of the
// seed and names the draw's version (docs/DRAW.md). The key is derived once
// per draw and AES-128 is the round function (as in NIST's FF1
// format-preserving encryption), because every pre-queued shopper's place
// is computed at the instant of opening, when the CPU is needed most.
const drawLabel = "flashsale/draw/v2"

// Permuter computes the draw for one seed and one pre-queue size. It reuses
// its block buffers, so it is not safe for concurrent use.
type Permuter struct {
	n       uint64
	half    uint // bits per Feistel half
	mask    uint64
	block   cipher.Block
	in, out [aes.BlockSize]byte
}

// NewPermuter returns the permutation of [0, n) keyed by seed.
func NewPermuter(seed []byte, n uint64) *Permuter {
	p := &Permuter{n: n}
	bits := uint(0)
	for n > 1 && (uint64(1)<<bits) < n {
		bits++
	}
	p.half = (bits + 1) / 2
	if p.half == 0 {
		p.half = 1
	}
	p.mask = uint64(1)<<p.half - 1
	m := hmac.New(sha256.New, seed)
	m.Write([]byte(drawLabel))
	m.Write(binary.BigEndian.AppendUint64(nil, n))
	block, err := aes.NewCipher(m.Sum(nil)[:16])
	if err != nil {
		panic("waitroom: NewPermuter: " + err.Error()) // a 16-byte key is always valid
	}
	p.block = block
	return p
}

// round is the Feistel round function: the first 8 bytes, big-endian, of
// AES-128 with the draw key over the block round | 7 zero bytes | x,
// masked to half bits.
func (p *Permuter) round(r byte, x uint64) uint64 {
	p.in[0] = r
	binary.BigEndian.PutUint64(p.in[8:], x)
	p.block.Encrypt(p.out[:], p.in[:])
	return binary.BigEndian.Uint64(p.out[:8]) & p.mask
}

// encrypt is the balanced Feistel network over [0, 2^(2*half)).
func (p *Permuter) encrypt(x uint64) uint64 {
	l, r := x>>p.half, x&p.mask
	for i := 0; i < drawRounds; i++ {
		l, r = r, l^p.round(byte(i), r)
	}
	return l<<p.half | r
}

// Place returns the place (0-based) of pre-queue ticket i. It panics when
// i >= n.
func (p *Permuter) Place(i uint64) uint64 {
	if i >= p.n {
		panic("waitroom: Permuter.Place: index out of range")
	}
	if p.n == 1 {
		return 0
	}
	// Cycle walking: the Feistel domain is at most 4n, so this ends after a
	// few steps on average and always ends (a permutation's cycle through i
	// returns to i, which is < n).
	y := p.encrypt(i)
	for y >= p.n {
		y = p.encrypt(y)
	}
	return y
}

// Permute returns the place (0-based) of pre-queue ticket i among n
// pre-queue tickets for the draw keyed by seed (docs/DRAW.md). It panics
// when i >= n.
func Permute(seed []byte, n, i uint64) uint64 { return NewPermuter(seed, n).Place(i) }

// DrawReport is what VerifyDraw found.
type DrawReport struct {
	SaleID int64
	// Commitment is the sale's published commitment; CommitmentOK reports
	// whether it is the hex SHA-256 of the seed.
	Commitment   string
	SeedHex      string
	CommitmentOK bool
	// Drawn reports whether the draw has happened (the pre-queue is frozen).
	Drawn bool
	// PreQueue is the pre-queue's user ids in ticket order; Order the same
	// users in drawn order (Order[place] = user id).
	PreQueue []int64
	Order    []int64
	// Checked is the number of admission records compared with the draw;
	// Mismatches describes the first few disagreements.
	Checked    int
	Mismatches []string
	OK         bool
}

// PreQueue returns the user ids of the sale's pre-queue in ticket order and
// whether the pre-queue is frozen (the draw happened). Before the draw it
// returns the joiners so far.
func PreQueue(ctx context.Context, rdb redis.UniversalClient, saleID int64) (users []int64, frozen bool, err error) {
	n, err := rdb.HGet(ctx, lua.QueueKey(saleID, keyState), fieldN).Int64()
	switch {
	case errors.Is(err, redis.Nil):
		n = -1
	case err != nil:
		return nil, false, fmt.Errorf("waitroom.PreQueue: %w", err)
	}
	stop := int64(-1)
	if n >= 0 {
		if n == 0 {
			return nil, true, nil
		}
		stop = n - 1
	}
	ids, err := rdb.LRange(ctx, lua.QueueKey(saleID, keyOrder), 0, stop).Result()
	if err != nil {
		return nil, false, fmt.Errorf("waitroom.PreQueue: %w", err)
	}
	users = make([]int64, len(ids))
	for i, s := range ids {
		if users[i], err = strconv.ParseInt(s, 10, 64); err != nil {
			return nil, false, fmt.Errorf("waitroom.PreQueue: bad user id %q", s)
		}
	}
	return users, n >= 0, nil
}

// Places returns the place in the sale's queue of every user holding a
// ticket (userId → place, 0-based): the drawn place for the n pre-queue
// tickets (Permute with the sale's seed), the ticket itself after them.
// Before the draw it fails. A user who went to the back of the queue has
// the place of their last ticket.
func Places(ctx context.Context, rdb redis.UniversalClient, saleID int64, seed []byte) (map[int64]int64, error) {
	n, err := rdb.HGet(ctx, lua.QueueKey(saleID, keyState), fieldN).Int64()
	if errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("waitroom.Places: sale %d: not drawn", saleID)
	}
	if err != nil {
		return nil, fmt.Errorf("waitroom.Places: %w", err)
	}
	ids, err := rdb.LRange(ctx, lua.QueueKey(saleID, keyOrder), 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("waitroom.Places: %w", err)
	}
	var p *Permuter
	if n > 0 {
		p = NewPermuter(seed, uint64(n))
	}
	out := make(map[int64]int64, len(ids))
	for t, s := range ids {
		u, err := strconv.ParseInt(s, 10, 64)
		if err != nil || u == 0 {
			continue // a ticket nobody could name after a Redis loss
		}
		place := int64(t)
		if place < n {
			place = int64(p.Place(uint64(t)))
		}
		out[u] = place
	}
	return out, nil
}

// VerifyDraw recomputes the sale's draw from its seed and the pre-queue
// stored in Redis and checks it against what the room did: the commitment
// matches the seed, every recorded admission carries the place the draw
// (or, after the pre-queue, the ticket) gives, and no admission lies beyond
// the "now serving" cursor. It is what `flashsale verify-draw` runs.
func VerifyDraw(ctx context.Context, rdb redis.UniversalClient, sale *flashsale.Sale) (DrawReport, error) {
	rep := DrawReport{SaleID: sale.ID, Commitment: sale.ShuffleCommitment, SeedHex: sale.SeedHex()}
	sum := sha256.Sum256(sale.ShuffleSeed)
	rep.CommitmentOK = len(sale.ShuffleSeed) > 0 && strings.EqualFold(hex.EncodeToString(sum[:]), sale.ShuffleCommitment)
	if !rep.CommitmentOK {
		rep.Mismatches = append(rep.Mismatches, "commitment is not the SHA-256 of the seed")
	}
	users, frozen, err := PreQueue(ctx, rdb, sale.ID)
	if err != nil {
		return rep, fmt.Errorf("waitroom.VerifyDraw: %w", err)
	}
	rep.PreQueue, rep.Drawn = users, frozen
	n := uint64(len(users))
	preTicket := make(map[int64]uint64, len(users))
	if frozen && n > 0 {
		rep.Order = make([]int64, n)
		p := NewPermuter(sale.ShuffleSeed, n)
		for i, u := range users {
			rep.Order[p.Place(uint64(i))] = u
			preTicket[u] = uint64(i)
		}
	}
	st, err := rdb.HGetAll(ctx, lua.QueueKey(sale.ID, keyState)).Result()
	if err != nil {
		return rep, fmt.Errorf("waitroom.VerifyDraw: %w", err)
	}
	serving, _ := strconv.ParseInt(st[fieldServing], 10, 64)
	tickets, err := rdb.HGetAll(ctx, lua.QueueKey(sale.ID, keyTickets)).Result()
	if err != nil {
		return rep, fmt.Errorf("waitroom.VerifyDraw: %w", err)
	}
	adm, err := rdb.HGetAll(ctx, lua.QueueKey(sale.ID, keyAdmitted)).Result()
	if err != nil {
		return rep, fmt.Errorf("waitroom.VerifyDraw: %w", err)
	}
	mismatch := func(format string, args ...any) {
		if len(rep.Mismatches) < 20 {
			rep.Mismatches = append(rep.Mismatches, fmt.Sprintf(format, args...))
		}
	}
	if !frozen && len(adm) > 0 {
		mismatch("%d admissions recorded before the draw", len(adm))
	}
	var perm *Permuter
	if frozen && n > 0 {
		perm = NewPermuter(sale.ShuffleSeed, n)
	}
	for us, v := range adm {
		rep.Checked++
		uid, err1 := strconv.ParseInt(us, 10, 64)
		place, _, err2 := parseAdmission(v)
		ticket, err3 := strconv.ParseInt(tickets[us], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			mismatch("user %s: malformed records (admission %q, ticket %q)", us, v, tickets[us])
			continue
		}
		want := ticket
		if ticket < int64(n) {
			if perm == nil {
				mismatch("user %d: pre-queue ticket %d before the draw", uid, ticket)
				continue
			}
			if i, ok := preTicket[uid]; !ok || int64(i) != ticket {
				mismatch("user %d: ticket %d is not this user's pre-queue entry", uid, ticket)
				continue
			}
			want = int64(perm.Place(uint64(ticket)))
		}
		if place != want {
			mismatch("user %d: admitted at place %d, draw gives %d", uid, place, want)
		}
		if place >= serving {
			mismatch("user %d: admitted at place %d beyond now-serving %d", uid, place, serving)
		}
	}
	rep.OK = len(rep.Mismatches) == 0
	return rep, nil
}

// parseAdmission parses an admission record "place|admittedAtMs".
func parseAdmission(v string) (place, atMs int64, err error) {
	ps, as, ok := strings.Cut(v, "|")
	if !ok {
		return 0, 0, errors.New("no separator")
	}
	if place, err = strconv.ParseInt(ps, 10, 64); err != nil {
		return 0, 0, err
	}
	if atMs, err = strconv.ParseInt(as, 10, 64); err != nil {
		return 0, 0, err
	}
	return place, atMs, nil
}
