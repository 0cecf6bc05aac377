package wiring

import (
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/flashsale/flashsale"
)

// BrokerConfig configures the embedded Kafka broker (kfake) that
// `flashsale dev` runs inside and `flashsale broker` runs alone.
type BrokerConfig struct {
	// Host is the listen (and advertised) address; "": 127.0.0.1.
	Host string
	// Port is the listen port; 0: any free port.
	Port int
	// DataDir keeps the broker's topics, records, group offsets and
	// producer IDs across restarts. Every batch is written to its file
	// before it is acknowledged, so a broker killed with -9 loses no
	// acknowledged record; flushing to the disk is left to the operating
	// system, as Kafka's default is (log.flush.interval.messages unset):
	// a machine that loses power may lose the last seconds. A per-batch
	// fsync in kfake's one request loop made every publish wait for the
	// others' syncs: 160 ms a record at 10,000 records/s on this kind of
	// machine, against 0.6 ms without. A shop that needs power-loss
	// durability runs a replicated Kafka (FLASHSALE_KAFKA_BROKERS). "":
	// in memory only (tests).
	DataDir string
	// Partitions of each seeded topic when the broker starts without
	// state; 0: 8.
	Partitions int32
}

// Group session timeouts the broker accepts: a writer with a short
// session timeout gets its partitions back within seconds of a crash, and
// kfake's default floor (6s) would refuse it.
const (
	brokerMinSessionTimeout = time.Second
	brokerMaxSessionTimeout = 5 * time.Minute
)

// Broker is a running embedded Kafka broker.
type Broker struct {
	c     *kfake.Cluster
	addrs []string
}

// StartBroker starts the embedded broker with the order topics seeded. A
// broker started on a DataDir that holds state reloads it: same topics
// with the same topic IDs, records and committed offsets.
func StartBroker(cfg BrokerConfig, logger *slog.Logger) (*Broker, error) {
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.Partitions <= 0 {
		cfg.Partitions = 8
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.SeedTopics(cfg.Partitions, flashsale.TopicOrders, flashsale.TopicDeadLetter, flashsale.TopicOrderEvents),
		kfake.GroupMinSessionTimeout(brokerMinSessionTimeout),
		kfake.GroupMaxSessionTimeout(brokerMaxSessionTimeout),
		kfake.Ports(cfg.Port),
	}
	if cfg.Host != "127.0.0.1" {
		host := cfg.Host
		opts = append(opts, kfake.ListenFn(func(network, address string) (net.Listener, error) {
			_, port, err := net.SplitHostPort(address)
			if err != nil {
				return nil, err
			}
			return net.Listen(network, net.JoinHostPort(host, port))
		}))
	}
	if cfg.DataDir != "" {
		opts = append(opts, kfake.DataDir(cfg.DataDir))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("embedded kafka on %s: %w", net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)), err)
	}
	b := &Broker{c: c, addrs: c.ListenAddrs()}
	if logger != nil {
		logger.Info("embedded Kafka broker (kfake) started", "brokers", b.addrs, "dataDir", cfg.DataDir)
	}
	return b, nil
}

// Addrs are the host:port the broker listens on.
func (b *Broker) Addrs() []string { return b.addrs }

// Close stops the broker; with a DataDir its state is synced to disk
// first.
func (b *Broker) Close() { b.c.Close() }
