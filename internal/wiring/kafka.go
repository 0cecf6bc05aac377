package wiring

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/kafka"
)

// ensureTopics creates the order and dead-letter topics on a real Kafka
// when they are missing.
func ensureTopics(ctx context.Context, brokers []string, cfg Config, logger *slog.Logger) error {
	if err := kafka.EnsureTopics(ctx, brokers, cfg.KafkaSecurity, cfg.KafkaTopics, logger.With("component", "kafka-topics"),
		flashsale.TopicOrders, flashsale.TopicDeadLetter, flashsale.TopicOrderEvents); err != nil {
		return fmt.Errorf("kafka topics: %w", err)
	}
	return nil
}

// kafkaPinger checks broker reachability for /readyz with one long-lived
// metadata client.
type kafkaPinger struct{ cl *kgo.Client }

func newKafkaPinger(brokers []string, sec kafka.Security, logger *slog.Logger) (*kafkaPinger, error) {
	opts, err := kafka.ClientOpts(brokers, sec, logger.With("component", "kafka-ping"))
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	cl, err := kgo.NewClient(opts...)
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
