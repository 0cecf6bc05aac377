package redisstock

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/lua"
)

// Pipelining of Reserve. While RunPipeline runs, concurrent Reserve calls
// are handed to a few senders; each takes every call waiting at that moment
// and sends them to Redis as one pipeline (one write and one read on each
// side instead of one per call). Each script still runs alone and atomic,
// in the order sent, so nothing about the reservation changes; only the
// round trips are shared. A sender takes no more than it finds waiting, so
// a lone call goes out at once and batches form only while the senders are
// busy, that is under load.

// DefaultPipelineSenders is the number of pipelines one Store keeps on the
// wire at most (RunPipeline with senders ≤ 0).
const DefaultPipelineSenders = 4

// maxPipeline caps the calls of one pipeline.
const maxPipeline = 256

// pipelineTimeout bounds a pipeline whose calls carry no deadline.
const pipelineTimeout = 2 * time.Second

// reserveCall is one Reserve waiting for a sender: the reserve script of
// a sale, or the home-shard one of a sharded sale, with its keys; or a
// holder's Claim, whose script takes args instead.
type reserveCall struct {
	ctx            context.Context
	script         *redis.Script
	keys           []string
	itemID, userID int64
	orderID        string
	nowMs          int64
	args           []any          // nil: the reserve arguments above
	done           chan callReply // buffered 1: the sender never blocks
}

// argv is the call's script arguments.
func (c *reserveCall) argv() []any {
	if c.args != nil {
		return c.args
	}
	return []any{c.itemID, c.userID, c.orderID, c.nowMs}
}

// callReply is the script's reply to one call, and the WAIT that followed
// it (nil when RequireReplicas asks for none).
type callReply struct {
	res  []any
	err  error
	wait *redis.Cmd
}

// pipeline is the state RunPipeline shares with Reserve.
type pipeline struct {
	calls   chan *reserveCall // unbuffered: a call is taken by a sender or not at all
	running atomic.Bool
	stopped chan struct{} // closed once no sender takes calls any more

	batches, sent atomic.Int64
}

var callPool = sync.Pool{New: func() any { return &reserveCall{done: make(chan callReply, 1)} }}

// RunPipeline hands Reserve calls to senders (DefaultPipelineSenders when
// senders ≤ 0) until ctx ends; calls taken by then are answered before it
// returns, later calls go straight to Redis again. One run per Store.
func (s *Store) RunPipeline(ctx context.Context, senders int) error {
	if senders <= 0 {
		senders = DefaultPipelineSenders
	}
	p := &pipeline{calls: make(chan *reserveCall), stopped: make(chan struct{})}
	if !s.pipe.CompareAndSwap(nil, p) {
		return fmt.Errorf("redisstock.RunPipeline: already running")
	}
	p.running.Store(true)
	var wg sync.WaitGroup
	for range senders {
		wg.Go(func() { s.send(ctx, p) })
	}
	wg.Wait()
	// Calls blocked in Reserve now see stopped and go straight to Redis.
	p.running.Store(false)
	close(p.stopped)
	return nil
}

// PipelineStats reports how many pipelines were sent and how many Reserve
// calls they carried (both 0 when RunPipeline never ran).
func (s *Store) PipelineStats() (pipelines, calls int64) {
	if p := s.pipe.Load(); p != nil {
		return p.batches.Load(), p.sent.Load()
	}
	return 0, 0
}

// send is one sender: it waits for a call, takes the others waiting, and
// sends them together.
func (s *Store) send(ctx context.Context, p *pipeline) {
	batch := make([]*reserveCall, 0, maxPipeline)
	for {
		select {
		case <-ctx.Done():
			return
		case c := <-p.calls:
			batch = append(batch[:0], c)
		}
	more:
		for len(batch) < maxPipeline {
			select {
			case c := <-p.calls:
				batch = append(batch, c)
			default:
				break more
			}
		}
		s.sendBatch(p, batch)
		clear(batch)
	}
}

// sendBatch runs the calls of batch as one pipeline and answers each. The
// pipeline is bounded by the latest deadline among the calls, so no call
// is cut shorter than its own bound.
func (s *Store) sendBatch(p *pipeline, batch []*reserveCall) {
	deadline := time.Time{}
	for _, c := range batch {
		if d, ok := c.ctx.Deadline(); ok && d.After(deadline) {
			deadline = d
		}
	}
	if deadline.IsZero() {
		deadline = time.Now().Add(pipelineTimeout)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(batch))
	for i, c := range batch {
		cmds[i] = c.script.EvalSha(ctx, pipe, c.keys, c.argv()...)
	}
	// One WAIT covers every script before it on this connection.
	wait := s.waitCmd(ctx, pipe)
	_, _ = pipe.Exec(ctx) // errors are per command, read below
	p.batches.Add(1)
	p.sent.Add(int64(len(batch)))
	for i, c := range batch {
		res, err := cmds[i].Slice()
		if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			// Redis forgot the script (restart, SCRIPT FLUSH): this call
			// did not run; run it alone, which loads it again (with its
			// own WAIT).
			if c.args != nil {
				res, err := c.script.Run(ctx, s.rdb, c.keys, c.args...).Slice()
				c.done <- callReply{res: res, err: err}
				continue
			}
			c.done <- s.runScript(ctx, c.script, c.keys, c.itemID, c.userID, c.orderID, c.nowMs)
			continue
		}
		c.done <- callReply{res: res, err: err, wait: wait}
	}
}

// reserveKeys are the KEYS of the reserve script for a sale, with room for
// the fifth a hold (holds) or a purchase under a lease (owners) appends.
func reserveKeys(saleID int64) []string {
	k := make([]string, 4, 5)
	k[0], k[1], k[2], k[3] = lua.StockKey(saleID), lua.BuyersKey(saleID), lua.PendingKey(saleID), lua.ReservedKey(saleID)
	return k
}

// pipelined hands a Reserve's script call to the senders when RunPipeline
// runs, and returns the script's reply; taken is false when it does not
// run (the caller goes straight to Redis). Once a sender took the call, it
// waits for the answer whatever ctx does: the script may be on the wire,
// and only its answer says whether a unit was taken (the sender's pipeline
// ends by the call's deadline).
func (s *Store) pipelined(ctx context.Context, script *redis.Script, keys []string, itemID, userID int64, orderID string, nowMs int64) (taken bool, r callReply) {
	p := s.pipe.Load()
	if p == nil || !p.running.Load() {
		return false, callReply{}
	}
	c := callPool.Get().(*reserveCall)
	c.ctx, c.script, c.keys = ctx, script, keys
	c.itemID, c.userID, c.orderID, c.nowMs = itemID, userID, orderID, nowMs
	return handOff(ctx, p, c)
}

// handOff gives c to a sender and waits for its answer (see pipelined),
// then returns c to the pool.
func handOff(ctx context.Context, p *pipeline, c *reserveCall) (taken bool, r callReply) {
	select {
	case p.calls <- c:
		taken, r = true, <-c.done
	case <-p.stopped:
	case <-ctx.Done():
		taken, r = true, callReply{err: ctx.Err()} // never sent
	}
	c.ctx, c.script, c.keys, c.args = nil, nil, nil, nil
	callPool.Put(c)
	return taken, r
}

// pipelinedArgs is pipelined for a script of other arguments (a holder's
// Claim): the same senders, batches and answers.
func (s *Store) pipelinedArgs(ctx context.Context, script *redis.Script, keys []string, args ...any) (taken bool, r callReply) {
	p := s.pipe.Load()
	if p == nil || !p.running.Load() {
		return false, callReply{}
	}
	c := callPool.Get().(*reserveCall)
	c.ctx, c.script, c.keys, c.args = ctx, script, keys, args
	return handOff(ctx, p, c)
}
