package auth

import (
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flashsale/flashsale"
)

// Cache remembers verified access tokens so a shopper's repeated requests
// (the flood of clicks at a drop) pay for one signature check, not one per
// request. Only valid tokens enter it, each until its own expiry, so forged
// tokens cannot fill it; its size is bounded (a full shard is emptied).
//
// A cached verdict never outlives the key that gave it: each entry holds
// the verifier's key generation, and an entry from before a JWKS fetch that
// removed or replaced a key is verified again (a token of a rotated-out
// key is refused from that fetch on, and in any case never past its own
// exp).
type Cache struct {
	v      *Verifier
	seed   maphash.Seed
	shards [64]cacheShard
	per    int
}

// cacheShard is read without locks (sync.Map: a shopper's repeated
// requests read the same key from every core); n bounds its size.
type cacheShard struct {
	m sync.Map // string → cacheEntry
	n atomic.Int64
}

type cacheEntry struct {
	p   flashsale.Principal
	exp time.Time
	gen uint64 // Verifier.generation when verified
}

// NewCache wraps v with a cache of at most size tokens.
func NewCache(v *Verifier, size int) *Cache {
	if size < 64 {
		size = 64
	}
	return &Cache{v: v, seed: maphash.MakeSeed(), per: size / 64}
}

// Verify is Verifier.Verify with the cache in front. token may be backed by
// a reused buffer: the cache keeps its own copy.
func (c *Cache) Verify(token string) (flashsale.Principal, error) {
	return c.VerifyAt(token, c.v.now())
}

// VerifyAt is Verify with the caller's clock reading, for a caller that
// already read the time for this request (the gateway reuses its
// request's time). now only decides whether a cached entry has expired;
// a token not in the cache is verified as Verify does.
func (c *Cache) VerifyAt(token string, now time.Time) (flashsale.Principal, error) {
	if token == "" || len(token) > MaxTokenLen {
		return flashsale.Principal{}, errUnauthenticated
	}
	sh := &c.shards[maphash.String(c.seed, token)%uint64(len(c.shards))]
	if v, ok := sh.m.Load(token); ok {
		if e := v.(cacheEntry); now.Before(e.exp) && e.gen == c.v.generation() {
			return e.p, nil
		}
	}
	gen := c.v.generation() // read before verifying: a fetch meanwhile voids the entry
	p, exp, err := c.v.verify(token)
	if err != nil {
		return p, err
	}
	if sh.n.Add(1) > int64(c.per) {
		sh.m.Clear()
		sh.n.Store(1)
	}
	sh.m.Store(strings.Clone(token), cacheEntry{p: p, exp: exp, gen: gen})
	return p, nil
}
