package wiring_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/wiring"
)

// TestBrokerAcceptsShortSessions: a consumer group member with a session
// timeout of a few seconds (a writer that must get its partitions back
// soon after a crash) joins the embedded broker and consumes.
func TestBrokerAcceptsShortSessions(t *testing.T) {
	b, err := wiring.StartBroker(wiring.BrokerConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...), kgo.DefaultProduceTopic(flashsale.TopicOrders),
		kgo.ConsumerGroup("short-session"), kgo.ConsumeTopics(flashsale.TopicOrders),
		kgo.SessionTimeout(2*time.Second), kgo.HeartbeatInterval(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("x")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	for {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("no record through a group with a 2s session timeout: %v", fs.Errors())
		}
		for _, fe := range fs.Errors() {
			t.Fatalf("poll: %v", fe.Err)
		}
		if fs.NumRecords() > 0 {
			return
		}
	}
}
