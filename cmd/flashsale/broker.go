package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/flashsale/flashsale/internal/wiring"
)

// defaultKafkaDataDir is where the embedded broker keeps its data, beside
// the local Redis and PostgreSQL of `flashsale dev` (.flashsale/).
const defaultKafkaDataDir = ".flashsale/kafka"

// cmdBroker runs the embedded Kafka broker alone, for stacks of separate
// processes (gateways, writer, expiry pointed at it with
// FLASHSALE_KAFKA_BROKERS). It prints its address on stdout, then serves
// until SIGTERM or SIGINT, when it syncs its data and exits.
// brokerDefaults are the settings' defaults of `flashsale broker`: a fixed
// port and a data directory, so the other processes can find it and it
// keeps its records across restarts.
func brokerDefaults() wiring.Config {
	cfg := wiring.Defaults()
	cfg.KafkaPort, cfg.KafkaDataDir = 9092, defaultKafkaDataDir
	return cfg
}

func cmdBroker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	env := brokerDefaults()
	if err := env.LoadEnv(); err != nil {
		return err
	}
	cfg := wiring.BrokerConfig{Host: env.KafkaHost, Port: env.KafkaPort, DataDir: env.KafkaDataDir, Partitions: 8}
	logFormat, logLevel := env.LogFormat, env.LogLevel
	fs := newFlagSet("broker", stderr)
	fs.StringVar(&cfg.Host, "host", cfg.Host, "listen address, also the one advertised to clients: give one they can reach, not a wildcard (FLASHSALE_KAFKA_HOST)")
	fs.IntVar(&cfg.Port, "port", cfg.Port, "listen port (FLASHSALE_KAFKA_PORT; 0: any free port)")
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, `where topics, records and group offsets are kept, every batch written before it is acknowledged (FLASHSALE_KAFKA_DATA_DIR; "": memory only, lost at exit)`)
	partitions := fs.Int("partitions", int(cfg.Partitions), "partitions of each order topic created on a first start")
	fs.StringVar(&logFormat, "log-format", logFormat, "json or text (FLASHSALE_LOG_FORMAT)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *partitions < 1 || *partitions > 1<<16 {
		return fmt.Errorf("--partitions=%d: want 1 to 65536", *partitions)
	}
	cfg.Partitions = int32(*partitions)
	log := newLogger(logFormat, logLevel, stderr).With("role", "broker")
	if cfg.DataDir == "" {
		log.Warn("no data directory: the broker's records are lost when it stops")
	}
	b, err := wiring.StartBroker(cfg, log)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, strings.Join(b.Addrs(), ","))
	<-ctx.Done()
	log.Info("shutting down: syncing data")
	b.Close()
	log.Info("stopped")
	return nil
}
