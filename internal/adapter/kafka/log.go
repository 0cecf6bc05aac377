package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flashsale/flashsale"
)

// DefaultWriterGroup is the writer's consumer group.
const DefaultWriterGroup = "flashsale-writer"

// OrderLog reads how far the writer's consumer group got in the orders
// topic, and the orders it has not consumed yet. The reconciler uses it to
// tell an order whose record waits in Kafka (never lost, whatever the
// writer's state) from one whose record never reached the broker.
type OrderLog struct {
	opts         []kgo.Opt // brokers, TLS, SASL and logger of every client it opens
	topic, group string
	cl           *kgo.Client
	adm          *kadm.Client
}

// OrderLogConfig configures an OrderLog.
type OrderLogConfig struct {
	Brokers  []string
	Security Security // TLS and SASL to the brokers
	// Topic is the orders topic (default flashsale.TopicOrders); Group the
	// writer's consumer group (default DefaultWriterGroup).
	Topic, Group string
}

// NewOrderLog returns an OrderLog. It does not wait for a broker.
func NewOrderLog(cfg OrderLogConfig, logger *slog.Logger) (*OrderLog, error) {
	if cfg.Topic == "" {
		cfg.Topic = flashsale.TopicOrders
	}
	if cfg.Group == "" {
		cfg.Group = DefaultWriterGroup
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	opts, err := ClientOpts(cfg.Brokers, cfg.Security, logger.With("component", "kafka-order-log"))
	if err != nil {
		return nil, fmt.Errorf("kafka.NewOrderLog: %w", err)
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka.NewOrderLog: %w", err)
	}
	return &OrderLog{opts: opts, topic: cfg.Topic, group: cfg.Group, cl: cl, adm: kadm.NewClient(cl)}, nil
}

// Close closes the client.
func (l *OrderLog) Close() { l.cl.Close() }

// Progress returns, per partition of the orders topic, the group's
// committed offset (the next offset the writer reads; the partition's log
// start when the group never committed there) and the end offset (the
// offset the next record will get). The end offsets are read first, so
// every record acknowledged before the call is below its partition's end,
// and a committed offset at or past the end means all those records are in
// the database.
func (l *OrderLog) Progress(ctx context.Context) (committed, end map[int32]int64, err error) {
	defer func() {
		if err != nil {
			// The topic may have been re-created (a broker restarted
			// empty) under a new ID, which the client would not adopt.
			l.cl.PurgeTopicsFromClient(l.topic)
		}
	}()
	ends, err := l.adm.ListEndOffsets(ctx, l.topic)
	if err != nil {
		return nil, nil, fmt.Errorf("kafka.OrderLog.Progress: end offsets: %w", err)
	}
	if err := ends.Error(); err != nil {
		return nil, nil, fmt.Errorf("kafka.OrderLog.Progress: end offsets: %w", err)
	}
	starts, err := l.adm.ListStartOffsets(ctx, l.topic)
	if err != nil {
		return nil, nil, fmt.Errorf("kafka.OrderLog.Progress: start offsets: %w", err)
	}
	if err := starts.Error(); err != nil {
		return nil, nil, fmt.Errorf("kafka.OrderLog.Progress: start offsets: %w", err)
	}
	offs, err := l.adm.FetchOffsets(ctx, l.group)
	if err == nil {
		err = offs.Error()
	}
	if errors.Is(err, kerr.GroupIDNotFound) {
		// The writer never committed (or the broker lost the group):
		// it reads from the start of each partition.
		offs, err = nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("kafka.OrderLog.Progress: group offsets: %w", err)
	}
	end, committed = map[int32]int64{}, map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		end[o.Partition] = o.Offset
		committed[o.Partition] = 0
		if s, ok := starts.Lookup(l.topic, o.Partition); ok {
			committed[o.Partition] = s.Offset
		}
		if c, ok := offs.Lookup(l.topic, o.Partition); ok && c.At >= 0 {
			committed[o.Partition] = c.At
		}
	})
	if len(end) == 0 {
		return nil, nil, fmt.Errorf("kafka.OrderLog.Progress: topic %s has no partitions", l.topic)
	}
	return committed, end, nil
}

// LoggedOrder is an order as the orders topic holds it: its record's
// partition and offset beside it.
type LoggedOrder struct {
	flashsale.OrderPlaced
	Partition int32
	Offset    int64
}

// Unconsumed returns the orders of the records from committed up to end
// (as Progress returned them), partition by partition; undecodable records
// are skipped (the writer dead-letters them). It reads with a client of its
// own and stops when ctx ends (with ctx's error).
func (l *OrderLog) Unconsumed(ctx context.Context, committed, end map[int32]int64) ([]LoggedOrder, error) {
	from := map[int32]kgo.Offset{}
	left := map[int32]int64{}
	for p, e := range end {
		c := committed[p]
		if c < e {
			from[p] = kgo.NewOffset().At(c)
			left[p] = e
		}
	}
	if len(from) == 0 {
		return nil, nil
	}
	opts := append(slices.Clip(l.opts), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{l.topic: from}))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka.OrderLog.Unconsumed: %w", err)
	}
	defer cl.Close()
	var out []LoggedOrder
	for len(left) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("kafka.OrderLog.Unconsumed: %w", err)
		}
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			e, ok := left[p.Partition]
			if !ok {
				return
			}
			for _, r := range p.Records {
				if r.Offset >= e {
					break
				}
				o := LoggedOrder{Partition: r.Partition, Offset: r.Offset}
				if json.Unmarshal(r.Value, &o.OrderPlaced) == nil {
					out = append(out, o)
				}
			}
			// The orders topic is written without transactions: its
			// offsets have no gaps, so the record before the end is the
			// last one.
			if n := len(p.Records); n > 0 && p.Records[n-1].Offset >= e-1 {
				delete(left, p.Partition)
			}
		})
	}
	return out, nil
}
