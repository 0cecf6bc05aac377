package defense

import (
	"sync"
	"sync/atomic"
	"time"
)

const numShards = 64 // power of two

// limiterMap holds one token bucket per key, sharded so that concurrent
// requests rarely meet on a lock. Each shard holds at most capPerShard keys;
// a new key in a full shard evicts the least recently seen of a few sampled
// keys. Idle keys are removed by evictIdle.
//
// With share set, every allowed request is also counted on its bucket, and
// the first count since the last drain puts the key on its shard's dirty
// list, so drain visits only the keys that spent (the fleet sharing of
// fleet.go publishes them); debit takes another gateway's spend off a
// bucket this gateway holds.
type limiterMap[K comparable] struct {
	hash        func(K) uint64
	capPerShard int
	share       bool
	shards      [numShards]limiterShard[K]
}

type limiterShard[K comparable] struct {
	mu sync.RWMutex
	m  map[K]*bucket

	dmu   sync.Mutex
	dirty []spentKey[K] // keys whose bucket spent since the last drain
	spare []spentKey[K] // the drained list, reused (touched by drain only)
	_     [32]byte      // keep shards on separate cache lines
}

type spentKey[K comparable] struct {
	key K
	b   *bucket
}

// bucket is one key's token bucket. tokens may go below zero when other
// gateways' spend is debited: the debt is paid back by the refill before
// this gateway allows the key again. gen is the settings generation its
// limit was set for; seen is the last local use in Unix nanoseconds; spent
// counts the requests allowed since the last drain.
type bucket struct {
	mu     sync.Mutex
	tokens float64
	last   int64 // Unix nanoseconds tokens was computed at
	rps    float64
	burst  float64
	gen    uint64

	seen  atomic.Int64
	spent atomic.Uint32
}

func newBucket(l Limit, gen uint64, ns int64) *bucket {
	b := &bucket{tokens: float64(l.Burst), last: ns, rps: l.RPS, burst: float64(l.Burst), gen: gen}
	b.seen.Store(ns)
	return b
}

// advance refills the bucket up to ns (a clock going back refills
// nothing). Caller holds mu.
func (b *bucket) advance(ns int64) {
	if ns <= b.last {
		return
	}
	if b.tokens < b.burst {
		b.tokens += float64(ns-b.last) * b.rps / float64(time.Second)
		if b.tokens > b.burst {
			b.tokens = b.burst
		}
	}
	b.last = ns
}

// take takes one token at ns under limit l (of settings generation gen)
// and returns 0, or how long until a token is there when it refuses.
func (b *bucket) take(l Limit, gen uint64, ns int64) time.Duration {
	b.mu.Lock()
	b.advance(ns)
	if b.gen != gen { // new limits take effect from now on
		b.rps, b.burst, b.gen = l.RPS, float64(l.Burst), gen
		if b.tokens > b.burst {
			b.tokens = b.burst
		}
	}
	if b.tokens >= 1 {
		b.tokens--
		b.mu.Unlock()
		return 0
	}
	missing := 1 - b.tokens
	b.mu.Unlock()
	d := time.Duration(missing / l.RPS * float64(time.Second))
	if d < time.Millisecond {
		d = time.Millisecond
	}
	return d
}

// debit takes n tokens at ns, below zero if need be.
func (b *bucket) debit(n float64, ns int64) {
	b.mu.Lock()
	b.advance(ns)
	b.tokens -= n
	b.mu.Unlock()
}

func newLimiterMap[K comparable](maxKeys int, hash func(K) uint64, share bool) *limiterMap[K] {
	per := (maxKeys + numShards - 1) / numShards
	if per < 1 {
		per = 1
	}
	m := &limiterMap[K]{hash: hash, capPerShard: per, share: share}
	for i := range m.shards {
		m.shards[i].m = make(map[K]*bucket)
	}
	return m
}

func (m *limiterMap[K]) shard(key K) *limiterShard[K] {
	return &m.shards[m.hash(key)&(numShards-1)]
}

// allow takes one token from key's bucket, whose limit is l (as of settings
// generation gen). It returns 0 when allowed, else how long until a token is
// available. It allocates only when the key is new (and, with share, when
// a dirty list outgrows what it held before).
func (m *limiterMap[K]) allow(key K, l Limit, gen uint64, now time.Time) time.Duration {
	sh := m.shard(key)
	ns := now.UnixNano()
	b := sh.get(key, l, gen, ns, m.capPerShard)
	if ns-b.seen.Load() > int64(time.Second) { // write the shared word rarely
		b.seen.Store(ns)
	}
	d := b.take(l, gen, ns)
	if d == 0 && m.share && b.spent.Add(1) == 1 {
		sh.markDirty(key, b, m.capPerShard)
	}
	return d
}

func (sh *limiterShard[K]) get(key K, l Limit, gen uint64, ns int64, capPerShard int) *bucket {
	sh.mu.RLock()
	b := sh.m[key]
	sh.mu.RUnlock()
	if b != nil {
		return b
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if b = sh.m[key]; b != nil {
		return b
	}
	if len(sh.m) >= capPerShard {
		sh.evictOne()
	}
	b = newBucket(l, gen, ns)
	sh.m[key] = b
	return b
}

// markDirty lists key for the next drain. The list holds at most twice the
// shard's keys (a drain that does not come must not grow it forever); past
// that the spend is forgotten and the key may be listed again later.
func (sh *limiterShard[K]) markDirty(key K, b *bucket, capPerShard int) {
	sh.dmu.Lock()
	if len(sh.dirty) < 2*capPerShard {
		sh.dirty = append(sh.dirty, spentKey[K]{key, b})
		sh.dmu.Unlock()
		return
	}
	sh.dmu.Unlock()
	b.spent.Store(0)
}

// drain calls fn with every key that spent since the last drain and how
// much, and resets those counts. One goroutine at a time may drain.
func (m *limiterMap[K]) drain(fn func(key K, n uint32)) {
	for i := range m.shards {
		sh := &m.shards[i]
		sh.dmu.Lock()
		list := sh.dirty
		sh.dirty = sh.spare[:0]
		sh.dmu.Unlock()
		for _, e := range list {
			// Swap after the list is taken: a spend after it lists the
			// key again on the new list.
			if n := e.b.spent.Swap(0); n > 0 {
				fn(e.key, n)
			}
		}
		clear(list) // drop bucket pointers of evicted keys
		sh.spare = list[:0]
	}
}

// debit takes n tokens from key's bucket if this gateway holds one (a key
// it has not seen starts full when it comes, as any new key does).
func (m *limiterMap[K]) debit(key K, n float64, now time.Time) bool {
	sh := m.shard(key)
	sh.mu.RLock()
	b := sh.m[key]
	sh.mu.RUnlock()
	if b == nil {
		return false
	}
	b.debit(n, now.UnixNano())
	return true
}

// tokens returns key's tokens at now (for tests); ok is false when the key
// has no bucket.
func (m *limiterMap[K]) tokens(key K, now time.Time) (float64, bool) {
	sh := m.shard(key)
	sh.mu.RLock()
	b := sh.m[key]
	sh.mu.RUnlock()
	if b == nil {
		return 0, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance(now.UnixNano())
	return b.tokens, true
}

// evictOne removes the least recently seen of up to 8 keys (map iteration
// starts at a random place, so this is a sampled LRU). Caller holds mu.
func (sh *limiterShard[K]) evictOne() {
	var (
		victim K
		oldest int64
		n      int
	)
	for k, b := range sh.m {
		if s := b.seen.Load(); n == 0 || s < oldest {
			victim, oldest = k, s
		}
		if n++; n == 8 {
			break
		}
	}
	if n > 0 {
		delete(sh.m, victim)
	}
}

// evictIdle removes keys not seen since before cutoff and returns how many
// it removed.
func (m *limiterMap[K]) evictIdle(cutoff time.Time) int {
	c := cutoff.UnixNano()
	removed := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for k, b := range sh.m {
			if b.seen.Load() < c {
				delete(sh.m, k)
				removed++
			}
		}
		sh.mu.Unlock()
	}
	return removed
}

// len returns the number of keys held.
func (m *limiterMap[K]) len() int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.RLock()
		n += len(sh.m)
		sh.mu.RUnlock()
	}
	return n
}

// mix64 is the splitmix64 finalizer: a cheap, well-spread 64-bit hash.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
