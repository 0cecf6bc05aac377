// Package redisconn turns the Redis settings into a go-redis client: one
// node (a redis:// or rediss:// URL), a Redis Cluster (seed addresses) or a
// master found through Sentinel. It is the one place that builds a Redis
// client from configuration, so every binary and the test harness connect
// the same way; everything else takes a redis.UniversalClient.
package redisconn

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Config is one Redis topology: exactly one of URL, Cluster or Sentinels
// (with Master) is set.
type Config struct {
	// URL is one node: redis://[user:password@]host:port/db, or rediss://
	// for TLS (FLASHSALE_REDIS_URL).
	URL string
	// Cluster are host:port seeds of a Redis Cluster
	// (FLASHSALE_REDIS_CLUSTER).
	Cluster []string
	// Sentinels are host:port addresses of Sentinels that monitor Master
	// (FLASHSALE_REDIS_SENTINELS, FLASHSALE_REDIS_MASTER).
	Sentinels []string
	Master    string
	// Password authenticates to the data nodes (FLASHSALE_REDIS_PASSWORD);
	// with a URL it may stand in for the URL's own password.
	Password string
	// TLSCA is a PEM file of the CA that signed the nodes' certificates
	// (FLASHSALE_REDIS_TLS_CA). With the cluster or Sentinel form it turns
	// TLS on; with a URL it needs rediss://.
	TLSCA string

	// PoolSize and MinIdleConns size the pool of each node (0: go-redis's
	// defaults).
	PoolSize     int
	MinIdleConns int
}

// Set reports whether any Redis setting is given (then `flashsale dev`
// starts no redis-server of its own).
func (c Config) Set() bool {
	return c.URL != "" || len(c.Cluster) > 0 || len(c.Sentinels) > 0 || c.Master != "" ||
		c.Password != "" || c.TLSCA != ""
}

// String describes the topology for logs, without the password.
func (c Config) String() string {
	switch {
	case len(c.Cluster) > 0:
		return "cluster " + strings.Join(c.Cluster, ",")
	case len(c.Sentinels) > 0:
		return "sentinel master " + c.Master + " via " + strings.Join(c.Sentinels, ",")
	case c.URL != "":
		if u, err := url.Parse(c.URL); err == nil {
			return u.Redacted()
		}
		return "(unparsable URL)"
	}
	return "(not configured)"
}

// Validate checks the settings without connecting: exactly one topology,
// well-formed addresses, a master name with the sentinels and a readable CA.
func (c Config) Validate() error {
	_, err := c.options()
	return err
}

// topologies names the forms that are set, for the "more than one" error.
func (c Config) topologies() []string {
	var set []string
	if c.URL != "" {
		set = append(set, "FLASHSALE_REDIS_URL")
	}
	if len(c.Cluster) > 0 {
		set = append(set, "FLASHSALE_REDIS_CLUSTER")
	}
	if len(c.Sentinels) > 0 || c.Master != "" {
		set = append(set, "FLASHSALE_REDIS_SENTINELS")
	}
	return set
}

// options resolves the settings into go-redis's universal options.
func (c Config) options() (*redis.UniversalOptions, error) {
	set := c.topologies()
	switch len(set) {
	case 0:
		return nil, errors.New("redisconn: Redis is not configured: set FLASHSALE_REDIS_URL, FLASHSALE_REDIS_CLUSTER or FLASHSALE_REDIS_SENTINELS with FLASHSALE_REDIS_MASTER")
	case 1:
	default:
		return nil, fmt.Errorf("redisconn: %s are all set: choose one Redis topology", strings.Join(set, " and "))
	}
	o := &redis.UniversalOptions{PoolSize: c.PoolSize, MinIdleConns: c.MinIdleConns, Password: c.Password}
	var err error
	switch {
	case c.URL != "":
		err = c.urlOptions(o)
	case len(c.Cluster) > 0:
		o.Addrs, err = checkAddrs("FLASHSALE_REDIS_CLUSTER", c.Cluster)
		o.IsClusterMode = true
	default:
		if c.Master == "" {
			return nil, errors.New("redisconn: FLASHSALE_REDIS_SENTINELS is set but FLASHSALE_REDIS_MASTER (the monitored master's name) is not")
		}
		if len(c.Sentinels) == 0 {
			return nil, errors.New("redisconn: FLASHSALE_REDIS_MASTER is set but FLASHSALE_REDIS_SENTINELS (the Sentinel addresses) is not")
		}
		o.Addrs, err = checkAddrs("FLASHSALE_REDIS_SENTINELS", c.Sentinels)
		o.MasterName = c.Master
	}
	if err != nil {
		return nil, err
	}
	if c.TLSCA != "" {
		pool, err := loadCA(c.TLSCA)
		if err != nil {
			return nil, err
		}
		if o.TLSConfig == nil {
			if c.URL != "" {
				return nil, errors.New("redisconn: FLASHSALE_REDIS_TLS_CA is set but FLASHSALE_REDIS_URL is redis://: use rediss:// for TLS")
			}
			o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		o.TLSConfig.RootCAs = pool
	}
	return o, nil
}

// urlOptions fills o from the one-node URL.
func (c Config) urlOptions(o *redis.UniversalOptions) error {
	u, err := url.Parse(c.URL)
	if err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") || u.Host == "" {
		return fmt.Errorf("redisconn: FLASHSALE_REDIS_URL=%q: want redis://host:port/db or rediss://host:port/db", c.String())
	}
	ro, err := redis.ParseURL(c.URL)
	if err != nil {
		return fmt.Errorf("redisconn: FLASHSALE_REDIS_URL=%q: %w", c.String(), err)
	}
	if ro.Password != "" && c.Password != "" && ro.Password != c.Password {
		return errors.New("redisconn: FLASHSALE_REDIS_URL carries a password and FLASHSALE_REDIS_PASSWORD another: set one")
	}
	if ro.Password == "" {
		ro.Password = c.Password
	}
	o.Addrs = []string{ro.Addr}
	o.Username, o.Password, o.DB = ro.Username, ro.Password, ro.DB
	o.TLSConfig = ro.TLSConfig
	o.Protocol = ro.Protocol
	o.ClientName = ro.ClientName
	if ro.PoolSize != 0 && o.PoolSize == 0 {
		o.PoolSize = ro.PoolSize
	}
	// A min_idle_conns in the URL wins over the caller's default.
	if ro.MinIdleConns != 0 {
		o.MinIdleConns = ro.MinIdleConns
	}
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout = ro.DialTimeout, ro.ReadTimeout, ro.WriteTimeout
	o.MaxRetries = ro.MaxRetries
	return nil
}

// checkAddrs requires every entry to be host:port with a port in range.
func checkAddrs(name string, addrs []string) ([]string, error) {
	out := make([]string, 0, len(addrs))
	for _, a := range addrs {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			return nil, fmt.Errorf("redisconn: %s: %q is not host:port", name, a)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || host == "" {
			return nil, fmt.Errorf("redisconn: %s: %q is not host:port with a port from 1 to 65535", name, a)
		}
		out = append(out, a)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("redisconn: %s lists no address", name)
	}
	return out, nil
}

func loadCA(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("redisconn: FLASHSALE_REDIS_TLS_CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("redisconn: FLASHSALE_REDIS_TLS_CA: %s holds no PEM certificate", file)
	}
	return pool, nil
}

// New builds the client of the configured topology without connecting.
// The cluster form gives a *redis.ClusterClient, the others a
// *redis.Client (through Sentinel: one that follows the promoted master).
func New(c Config) (redis.UniversalClient, error) {
	o, err := c.options()
	if err != nil {
		return nil, err
	}
	if o.MasterName != "" {
		return redis.NewFailoverClient(o.Failover()), nil
	}
	if o.IsClusterMode {
		return redis.NewClusterClient(o.Cluster()), nil
	}
	return redis.NewClient(o.Simple()), nil
}

// Open builds the client and checks that every master answers, with an
// error that says what to fix (address, password, master name).
func Open(ctx context.Context, c Config) (redis.UniversalClient, error) {
	rdb, err := New(c)
	if err != nil {
		return nil, err
	}
	if err := Ping(ctx, rdb); err != nil {
		rdb.Close()
		return nil, fmt.Errorf("redisconn.Open: %s: %w", c.String(), explain(err))
	}
	return rdb, nil
}

// Ping checks that every master answers (readiness): on a cluster one
// unreachable master makes part of the keys unavailable.
func Ping(ctx context.Context, rdb redis.UniversalClient) error {
	return ForEachMaster(ctx, rdb, func(ctx context.Context, c *redis.Client) error {
		return c.Ping(ctx).Err()
	})
}

// ForEachMaster runs fn on every master: each master of a cluster (SCAN,
// FLUSHDB, INFO and the like only see one node's keys), or the one node.
func ForEachMaster(ctx context.Context, rdb redis.UniversalClient, fn func(context.Context, *redis.Client) error) error {
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		// Runs fn on the masters at once; it loads the slot map first.
		return c.ForEachMaster(ctx, fn)
	case *redis.Client:
		return fn(ctx, c)
	default:
		return fmt.Errorf("redisconn.ForEachMaster: unsupported client %T", rdb)
	}
}

// explain adds what to check to the errors a wrong setting gives.
func explain(err error) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "WRONGPASS"), strings.Contains(msg, "NOAUTH"),
		strings.Contains(msg, "invalid password"), strings.Contains(msg, "AUTH <password> called without any password"):
		return fmt.Errorf("authentication failed (check the password in the URL or FLASHSALE_REDIS_PASSWORD): %w", err)
	case strings.Contains(msg, "all sentinels specified in configuration are unreachable"),
		strings.Contains(msg, "No such master with that name"), strings.Contains(msg, "sentinel:"):
		return fmt.Errorf("no master found through the sentinels (check FLASHSALE_REDIS_MASTER and FLASHSALE_REDIS_SENTINELS): %w", err)
	}
	return err
}

// Commands is Redis's count of processed commands (INFO stats
// total_commands_processed), summed over every master: a cluster's nodes
// each count their own. Benchmarks and tests read it to show that a path
// never reached Redis.
func Commands(ctx context.Context, rdb redis.UniversalClient) (int64, error) {
	var (
		mu  sync.Mutex // ForEachMaster runs fn on the masters at once
		sum int64
	)
	err := ForEachMaster(ctx, rdb, func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "stats").Result()
		if err != nil {
			return err
		}
		n, err := parseTotalCommands(info)
		if err != nil {
			return err
		}
		mu.Lock()
		sum += n
		mu.Unlock()
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("redisconn.Commands: %w", err)
	}
	return sum, nil
}

func parseTotalCommands(info string) (int64, error) {
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if ok && k == "total_commands_processed" {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, errors.New("no total_commands_processed in INFO stats")
}
