package kafka

import (
	"context"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/harness/testenv"
)

// The order log reports the writer group's progress (the log start where it
// never committed, no error for a group that does not exist yet) and the
// orders past it; PublishAt reports where each record landed.
func TestOrderLogProgressAndUnconsumed(t *testing.T) {
	t.Parallel()
	k := testenv.NewKafka(t)
	p := newProducer(t, k.Brokers, hangBound)
	ctx := context.Background()
	at := map[string][2]int64{}
	for i := range 6 {
		o := flashsale.OrderPlaced{OrderID: "o" + strconv.Itoa(i), SaleID: 1, ItemID: int64(1001 + i%3), UserID: int64(i + 1)}
		part, off, err := p.PublishAt(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		at[o.OrderID] = [2]int64{int64(part), off}
	}
	l, err := NewOrderLog(OrderLogConfig{Brokers: k.Brokers}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	committed, end, err := l.Progress(ctx)
	if err != nil {
		t.Fatalf("Progress before any commit: %v", err)
	}
	var total int64
	for part, e := range end {
		if committed[part] != 0 {
			t.Errorf("partition %d committed %d before any commit, want 0", part, committed[part])
		}
		total += e
	}
	if total != 6 {
		t.Errorf("end offsets sum to %d, want 6", total)
	}
	for id, pos := range at {
		if pos[1] >= end[int32(pos[0])] {
			t.Errorf("order %s at %v, not below its partition's end %d", id, pos, end[int32(pos[0])])
		}
	}
	got, err := l.Unconsumed(ctx, committed, end)
	if err != nil {
		t.Fatal(err)
	}
	if ids := orderIDs(got); len(ids) != 6 {
		t.Fatalf("unconsumed %v, want the 6 orders", ids)
	}
	for _, o := range got {
		if pos := at[o.OrderID]; pos != [2]int64{int64(o.Partition), o.Offset} {
			t.Errorf("order %s read at %d:%d, published at %v", o.OrderID, o.Partition, o.Offset, pos)
		}
	}

	// The group consumes and commits everything: nothing is left.
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.ConsumerGroup(DefaultWriterGroup),
		kgo.ConsumeTopics(flashsale.TopicOrders), kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for n := 0; n < 6; {
		fs := cl.PollFetches(pctx)
		if pctx.Err() != nil {
			t.Fatalf("consumed %d of 6", n)
		}
		n += len(fs.Records())
		if err := cl.CommitRecords(pctx, fs.Records()...); err != nil {
			t.Fatal(err)
		}
	}
	committed, end, err = l.Progress(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for part, e := range end {
		if committed[part] != e {
			t.Errorf("partition %d committed %d, want its end %d", part, committed[part], e)
		}
	}
	if got, err := l.Unconsumed(ctx, committed, end); err != nil || len(got) != 0 {
		t.Errorf("unconsumed after the commit = %v, %v; want none", orderIDs(got), err)
	}
}

func orderIDs(os []LoggedOrder) []string {
	ids := make([]string, len(os))
	for i, o := range os {
		ids[i] = o.OrderID
	}
	sort.Strings(ids)
	return ids
}
