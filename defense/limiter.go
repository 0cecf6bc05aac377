package defense

import (
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

const numShards = 64 // power of two

// limiterMap holds one token bucket per key, sharded so that concurrent
// requests rarely meet on a lock. Each shard holds at most capPerShard keys;
// a new key in a full shard evicts the least recently seen of a few sampled
// keys. Idle keys are removed by evictIdle.
type limiterMap[K comparable] struct {
	hash        func(K) uint64
	capPerShard int
	shards      [numShards]limiterShard[K]
}

type limiterShard[K comparable] struct {
	mu sync.RWMutex
	m  map[K]*bucket
	_  [32]byte // keep shards on separate cache lines
}

// bucket is one key's limiter. gen is the settings generation its limit was
// set for; seen is the last use in Unix nanoseconds.
type bucket struct {
	lim  *rate.Limiter
	gen  atomic.Uint64
	seen atomic.Int64
}

func newLimiterMap[K comparable](maxKeys int, hash func(K) uint64) *limiterMap[K] {
	per := (maxKeys + numShards - 1) / numShards
	if per < 1 {
		per = 1
	}
	m := &limiterMap[K]{hash: hash, capPerShard: per}
	for i := range m.shards {
		m.shards[i].m = make(map[K]*bucket)
	}
	return m
}

// allow takes one token from key's bucket, whose limit is l (as of settings
// generation gen). It returns 0 when allowed, else how long until a token is
// available. It allocates only when the key is new.
func (m *limiterMap[K]) allow(key K, l Limit, gen uint64, now time.Time) time.Duration {
	b := m.get(key, l, gen, now)
	if b.gen.Load() != gen {
		b.lim.SetLimitAt(now, rate.Limit(l.RPS))
		b.lim.SetBurstAt(now, l.Burst)
		b.gen.Store(gen)
	}
	ns := now.UnixNano()
	if ns-b.seen.Load() > int64(time.Second) { // write the shared word rarely
		b.seen.Store(ns)
	}
	if b.lim.AllowN(now, 1) {
		return 0
	}
	missing := 1 - b.lim.TokensAt(now)
	d := time.Duration(missing / l.RPS * float64(time.Second))
	if d < time.Millisecond {
		d = time.Millisecond
	}
	return d
}

func (m *limiterMap[K]) get(key K, l Limit, gen uint64, now time.Time) *bucket {
	sh := &m.shards[m.hash(key)&(numShards-1)]
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
	if len(sh.m) >= m.capPerShard {
		sh.evictOne()
	}
	b = &bucket{lim: rate.NewLimiter(rate.Limit(l.RPS), l.Burst)}
	b.gen.Store(gen)
	b.seen.Store(now.UnixNano())
	sh.m[key] = b
	return b
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
