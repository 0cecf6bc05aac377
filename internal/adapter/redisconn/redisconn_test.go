package redisconn

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale/internal/harness/localsvc"
)

// TestValidate: every malformed topology is refused before any connection,
// naming the setting to fix; the well-formed ones pass.
func TestValidate(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.txt")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // "" when valid
	}{
		{"url", Config{URL: "redis://127.0.0.1:6379/0"}, ""},
		{"url tls", Config{URL: "rediss://u:p@127.0.0.1:6380/0"}, ""},
		{"cluster", Config{Cluster: []string{"10.0.0.1:6379", "redis-2:6379"}}, ""},
		{"sentinel", Config{Sentinels: []string{"10.0.0.1:26379"}, Master: "fs"}, ""},
		{"nothing", Config{}, "not configured"},
		{"password alone", Config{Password: "x"}, "not configured"},
		{"url and cluster", Config{URL: "redis://h:1/0", Cluster: []string{"h:2"}}, "FLASHSALE_REDIS_URL and FLASHSALE_REDIS_CLUSTER are all set"},
		{"cluster and sentinel", Config{Cluster: []string{"h:2"}, Sentinels: []string{"h:3"}, Master: "m"}, "choose one Redis topology"},
		{"seed without port", Config{Cluster: []string{"redis-1"}}, `FLASHSALE_REDIS_CLUSTER: "redis-1" is not host:port`},
		{"seed port zero", Config{Cluster: []string{"h:1", "h:0"}}, `"h:0" is not host:port with a port from 1 to 65535`},
		{"seed port text", Config{Cluster: []string{"h:redis"}}, "port from 1 to 65535"},
		{"seed without host", Config{Cluster: []string{":6379"}}, "port from 1 to 65535"},
		{"seeds all blank", Config{Cluster: []string{" ", ""}}, "FLASHSALE_REDIS_CLUSTER lists no address"},
		{"sentinel without master", Config{Sentinels: []string{"h:26379"}}, "FLASHSALE_REDIS_MASTER"},
		{"master without sentinels", Config{Master: "fs"}, "FLASHSALE_REDIS_SENTINELS (the Sentinel addresses) is not"},
		{"bad sentinel address", Config{Sentinels: []string{"h"}, Master: "fs"}, `FLASHSALE_REDIS_SENTINELS: "h" is not host:port`},
		{"url scheme", Config{URL: "http://h:1/0"}, "want redis://host:port/db or rediss://"},
		{"url db", Config{URL: "redis://h:1/x"}, "FLASHSALE_REDIS_URL"},
		{"two passwords", Config{URL: "redis://:a@h:1/0", Password: "b"}, "set one"},
		{"CA missing", Config{Cluster: []string{"h:1"}, TLSCA: filepath.Join(dir, "absent.pem")}, "FLASHSALE_REDIS_TLS_CA"},
		{"CA not PEM", Config{Cluster: []string{"h:1"}, TLSCA: notPEM}, "holds no PEM certificate"},
		{"CA with redis://", Config{URL: "redis://h:1/0", TLSCA: notPEM}, "FLASHSALE_REDIS_TLS_CA"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate = %v, want nil", err)
			case tc.want != "" && err == nil:
				t.Fatalf("Validate = nil, want an error with %q", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("Validate = %v, want an error with %q", err, tc.want)
			}
			if tc.want != "" {
				if _, err := New(tc.cfg); err == nil {
					t.Fatal("New accepted a config Validate refuses")
				}
			}
		})
	}
}

// TestStringHidesPassword: the topology as logged carries no password.
func TestStringHidesPassword(t *testing.T) {
	s := Config{URL: "redis://user:s3cret@h:1/0"}.String()
	if strings.Contains(s, "s3cret") {
		t.Errorf("String() = %q shows the password", s)
	}
}

func startRedis(t *testing.T, o localsvc.RedisOptions) *localsvc.Redis {
	t.Helper()
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	r, err := localsvc.StartRedis(context.Background(), o)
	if errors.Is(err, localsvc.ErrMissing) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Stop() })
	return r
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestWrongPassword: a wrong or missing password fails Open with a clear
// error; the right one, in the URL or beside it, connects.
func TestWrongPassword(t *testing.T) {
	r := startRedis(t, localsvc.RedisOptions{Password: "right"})
	ctx := ctxT(t)
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"wrong in URL", Config{URL: "redis://:wrong@" + r.Addr + "/0"}, false},
		{"wrong beside URL", Config{URL: "redis://" + r.Addr + "/0", Password: "wrong"}, false},
		{"missing", Config{URL: "redis://" + r.Addr + "/0"}, false},
		{"right in URL", Config{URL: "redis://:right@" + r.Addr + "/0"}, true},
		{"right beside URL", Config{URL: "redis://" + r.Addr + "/0", Password: "right"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb, err := Open(ctx, tc.cfg)
			if tc.ok {
				if err != nil {
					t.Fatalf("Open = %v, want a connection", err)
				}
				rdb.Close()
				return
			}
			if err == nil {
				rdb.Close()
				t.Fatal("Open succeeded with a wrong password")
			}
			if !strings.Contains(err.Error(), "authentication failed") || strings.Contains(err.Error(), "wrong@") {
				t.Fatalf("Open = %v, want an authentication error without the password", err)
			}
		})
	}
}

// TestUnreachableNotReady: Ping (readiness) fails while the one node is
// down and recovers when it is back.
func TestUnreachableNotReady(t *testing.T) {
	dir := t.TempDir()
	r := startRedis(t, localsvc.RedisOptions{Dir: dir})
	ctx := ctxT(t)
	rdb, err := Open(ctx, Config{URL: r.URL})
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	r.Stop()
	if err := Ping(ctx, rdb); err == nil {
		t.Fatal("Ping = nil with the node down")
	}
	_, port, _ := strings.Cut(r.Addr, ":")
	startRedis(t, localsvc.RedisOptions{Dir: dir, Port: atoi(t, port)})
	if err := Ping(ctx, rdb); err != nil {
		t.Fatalf("Ping after the restart = %v", err)
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			t.Fatalf("port %q", s)
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// TestSentinelUnknownMaster: a master name the sentinels do not monitor
// fails Open with an error naming FLASHSALE_REDIS_MASTER; the right name
// connects to the master.
func TestSentinelUnknownMaster(t *testing.T) {
	r := startRedis(t, localsvc.RedisOptions{})
	ctx := ctxT(t)
	s, err := localsvc.StartSentinel(ctx, localsvc.SentinelOptions{Dir: t.TempDir(), MasterName: "fs", MasterAddr: r.Addr})
	if errors.Is(err, localsvc.ErrMissing) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	octx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rdb, err := Open(octx, Config{Sentinels: []string{s.Addr}, Master: "nosuch"})
	if err == nil {
		rdb.Close()
		t.Fatal("Open succeeded with an unknown master name")
	}
	if !strings.Contains(err.Error(), "FLASHSALE_REDIS_MASTER") {
		t.Fatalf("Open = %v, want an error naming FLASHSALE_REDIS_MASTER", err)
	}
	rdb, err = Open(ctx, Config{Sentinels: []string{s.Addr}, Master: "fs"})
	if err != nil {
		t.Fatalf("Open with the monitored name = %v", err)
	}
	defer rdb.Close()
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	direct := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer direct.Close()
	if v, err := direct.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("the master holds k = %q, %v; want the write made through Sentinel", v, err)
	}
	// No master to serve (down, no replica to promote): not ready.
	r.Stop()
	pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
	defer pcancel()
	if err := Ping(pctx, rdb); err == nil {
		t.Error("Ping through Sentinel = nil with the master down, want an error (readiness 503)")
	}
}

// TestClusterForEachMaster: on a cluster, ForEachMaster reaches every
// master (a FLUSHDB or SCAN on one node would miss the others' keys).
func TestClusterForEachMaster(t *testing.T) {
	ctx := ctxT(t)
	c, err := localsvc.StartRedisCluster(ctx, localsvc.RedisClusterOptions{Dir: t.TempDir()})
	if errors.Is(err, localsvc.ErrMissing) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	rdb, err := Open(ctx, Config{Cluster: c.Addrs[:1]}) // one seed finds the rest
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	if _, ok := rdb.(*redis.ClusterClient); !ok {
		t.Fatalf("client %T, want a cluster client", rdb)
	}
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		if err := rdb.Set(ctx, k, "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var seen = make(chan string, len(c.Addrs))
	var keys = make(chan int64, len(c.Addrs))
	err = ForEachMaster(ctx, rdb, func(ctx context.Context, m *redis.Client) error {
		n, err := m.DBSize(ctx).Result()
		seen <- m.Options().Addr
		keys <- n
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	close(seen)
	close(keys)
	if len(seen) != len(c.Addrs) {
		t.Errorf("ForEachMaster reached %d masters, want %d", len(seen), len(c.Addrs))
	}
	var total int64
	for n := range keys {
		total += n
	}
	if total != 8 {
		t.Errorf("keys over every master = %d, want 8", total)
	}
}

// FuzzValidate: any URL or seed list is accepted or refused without a
// panic, and an accepted seed list holds only host:port entries.
func FuzzValidate(f *testing.F) {
	for _, s := range []string{"redis://h:1/0", "rediss://u:p@h:6380/2?dial_timeout=1s", "h:1,h:2", "h", ":0", "[::1]:6379", "redis://", "%zz", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		_ = Config{URL: s}.Validate()
		seeds := strings.Split(s, ",")
		if err := (Config{Cluster: seeds}).Validate(); err == nil {
			o, err := Config{Cluster: seeds}.options()
			if err != nil {
				t.Fatalf("options after Validate: %v", err)
			}
			for _, a := range o.Addrs {
				if !strings.Contains(a, ":") {
					t.Fatalf("accepted seed %q", a)
				}
			}
		}
	})
}

func TestParseTotalCommands(t *testing.T) {
	info := "# Stats\r\ntotal_connections_received:3\r\ntotal_commands_processed:12345\r\ninstantaneous_ops_per_sec:0\r\n"
	got, err := parseTotalCommands(info)
	if err != nil || got != 12345 {
		t.Errorf("parseTotalCommands = %d, %v; want 12345", got, err)
	}
	if _, err := parseTotalCommands("# Stats\r\n"); err == nil {
		t.Error("parseTotalCommands without the field: want an error")
	}
}

// TestCommandsCounts: Commands grows across a command sent to the server.
func TestCommandsCounts(t *testing.T) {
	r := startRedis(t, localsvc.RedisOptions{})
	ctx := ctxT(t)
	rdb, err := New(Config{URL: "redis://" + r.Addr})
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	a, err := Commands(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	rdb.Ping(ctx)
	b, err := Commands(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	if b <= a {
		t.Errorf("Commands went from %d to %d across a PING, want more", a, b)
	}
}
