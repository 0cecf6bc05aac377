package loadtest

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flashsale/flashsale/auth"
)

// workSpec is one process's share of the shoppers (and, in the
// coordinator, of nothing else). It travels to a worker as JSON on stdin.
type workSpec struct {
	Config    Config        `json:"config"`
	JWTSecret string        `json:"jwtSecret"` // Config hides it from JSON
	Sale      saleInfo      `json:"sale"`
	Epoch     time.Time     `json:"epoch"`     // timeseries zero
	JoinStart time.Time     `json:"joinStart"` // first join
	Spread    time.Duration `json:"spread"`
	Total     int           `json:"total"` // shoppers of the whole run (join schedule)
	First     int           `json:"first"` // global index of this share's first shopper
	Count     int           `json:"count"`
	Deadline  time.Time     `json:"deadline"`
	Worker    int           `json:"worker"` // this worker's index, 0…Processes-1
}

func newShard(cfg Config, sale saleInfo, rec *recorder, cl *clients) *shard {
	s := &shard{cfg: cfg, sale: sale, rec: rec, cl: cl, solve: cfg.SolvePow, ttl: cfg.Duration + time.Hour}
	if s.solve == nil {
		s.solve = defaultPowSolver
	}
	return s
}

// runShoppers starts shoppers First…First+Count-1 on the join schedule and
// waits for all of them (bounded by ctx).
func (s *shard) runShoppers(ctx context.Context, spec workSpec) {
	var wg sync.WaitGroup
	defer wg.Wait()
	if s.cfg.Preconnect > 0 && s.cfg.Transport == TransportWS {
		wg.Go(func() {
			if sleepCtx(ctx, time.Until(s.sale.OpensAt.Add(-preconnectLead))) && time.Now().Before(s.sale.OpensAt) {
				s.preconnect(ctx)
			}
		})
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	next := 0
	for next < spec.Count {
		now := time.Now()
		for next < spec.Count {
			g := spec.First + next
			at := spec.JoinStart
			if spec.Total > 1 {
				at = at.Add(time.Duration(float64(spec.Spread) * float64(g) / float64(spec.Total)))
			}
			if at.After(now) {
				break
			}
			hc, base := s.cl.forUser(g)
			sh := &shopper{idx: g, userID: s.cfg.UserBase + 1 + int64(g), hc: hc, base: base, gw: g % len(s.cl.bases)}
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.run(ctx, sh)
			}()
			next++
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// preconnectLead is how long before the opening a process warms its
// connections (Config.Preconnect): within the client's idle timeout (30 s),
// and early enough that tens of thousands of connections are made before
// the opening, not into it.
const preconnectLead = 15 * time.Second

// preconnect opens Config.Preconnect keep-alive connections per source
// address and gateway: that many concurrent GETs of the public sale view on
// each pair, whose connections then wait in the client's idle pool for the
// purchases at the opening.
func (s *shard) preconnect(ctx context.Context) {
	type pair struct {
		hc   *httpClient
		base string
	}
	jobs := make(chan pair)
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for p := range jobs {
				var each sync.WaitGroup
				for range s.cfg.Preconnect {
					each.Go(func() {
						t0 := time.Now()
						r, err := do(ctx, p.hc, http.MethodGet, p.base+"/api/flash-sales/sales/"+strconv.FormatInt(s.sale.ID, 10), nil, nil)
						s.rec.response(ctx, StepPreconnect, r, err)
						out := r.outcome()
						if err != nil {
							out = errOutcome(err)
						}
						s.rec.observe(StepPreconnect, out, t0, time.Since(t0), true)
					})
				}
				each.Wait()
			}
		})
	}
feed:
	for _, hc := range s.cl.byAddr {
		for _, base := range s.cl.bases {
			select {
			case jobs <- pair{hc, base}:
			case <-ctx.Done():
				break feed
			}
		}
	}
	close(jobs)
	wg.Wait()
}

// runOneAddr runs the one-address hostile shoppers (full flow, one source
// address, user ids after the shoppers').
func (s *shard) runOneAddr(ctx context.Context, n int) {
	var wg sync.WaitGroup
	for i := range n {
		sh := &shopper{
			idx: i, userID: s.cfg.UserBase + int64(s.cfg.Shoppers) + 1 + int64(i),
			prefix: oneAddrPrefix, hc: s.cl.oneAddr, base: s.cl.bases[i%len(s.cl.bases)], gw: i % len(s.cl.bases),
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.run(ctx, sh)
		}()
	}
	wg.Wait()
}

// hostileUserBase is where the flood's valid-but-unadmitted users start.
func (s *shard) hostileUserBase() int64 {
	return s.cfg.UserBase + int64(s.cfg.Shoppers) + int64(s.cfg.Hostile.OneAddrUsers) + 1
}

// hostile sends n purchases without valid tokens (flood) or by real users
// before opening without an admission (early), Concurrency at a time.
// It returns the number of requests sent.
func (s *shard) hostile(ctx context.Context, n int, early bool) int64 {
	if n <= 0 || len(s.sale.Items) == 0 {
		return 0
	}
	const tokens = 256
	toks := make([]string, tokens)
	for i := range toks {
		uid := s.hostileUserBase() + int64(i)
		if early && s.cfg.Shoppers > 0 {
			uid = s.cfg.UserBase + 1 + int64(i%s.cfg.Shoppers)
		}
		t, err := auth.Mint(s.cfg.JWTSecret, uid, false, s.ttl, time.Now())
		if err != nil {
			s.rec.errorf(err.Error())
			return 0
		}
		toks[i] = t
	}
	step := StepFlood
	if early {
		step = StepEarly
	}
	var next, sent atomic.Int64
	var wg sync.WaitGroup
	for range min(s.cfg.Hostile.Concurrency, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				it := s.sale.Items[i%len(s.sale.Items)]
				hc, base := s.cl.forUser(i)
				hdr := map[string]string{}
				tok := toks[i%tokens]
				variant := i % 4
				if early {
					variant = 2 + i%2
				}
				switch variant {
				case 0: // no credentials at all
				case 1:
					hdr["Authorization"] = "Bearer garbage.not-a.jwt"
				case 2:
					hdr["Authorization"] = "Bearer " + tok
				case 3:
					hdr["Authorization"] = "Bearer " + tok
					hdr["X-Admission-Token"] = "forged-admission-token"
				}
				t0 := time.Now()
				r, err := do(ctx, hc, http.MethodPost, base+purchasePath(it.ID), hdr, nil)
				s.rec.live.hostile.Add(1)
				sent.Add(1)
				s.rec.response(ctx, step, r, err)
				if err != nil {
					s.rec.observe(step, errOutcome(err), t0, time.Since(t0), true)
					continue
				}
				s.rec.observe(step, r.outcome(), t0, time.Since(t0), true)
			}
		}()
	}
	wg.Wait()
	return sent.Load()
}

func purchasePath(itemID int64) string {
	return "/api/flash-sales/items/" + itoa(itemID) + "/purchase"
}

func itoa(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}
