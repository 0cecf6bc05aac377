package wiring

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/kafka"
)

// ensureTopics creates the order and dead-letter topics on a real Kafka
// when they are missing.
func ensureTopics(ctx context.Context, brokers []string) error {
	if err := kafka.EnsureTopics(ctx, brokers, 8, flashsale.TopicOrders, flashsale.TopicDeadLetter); err != nil {
		return fmt.Errorf("kafka topics: %w", err)
	}
	return nil
}

// kafkaPinger checks broker reachability for /readyz with one long-lived
// metadata client.
type kafkaPinger struct{ cl *kgo.Client }

func newKafkaPinger(brokers []string) (*kafkaPinger, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	return &kafkaPinger{cl: cl}, nil
}

func (k *kafkaPinger) Ping(ctx context.Context) error {
	if err := k.cl.Ping(ctx); err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	return nil
}

func (k *kafkaPinger) Close() { k.cl.Close() }
