package localsvc

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// RedisCluster is a running Redis Cluster of masters without replicas, each
// a redis-server child process.
type RedisCluster struct {
	Addrs   []string // host:port of every master, the seeds
	Nodes   []*Redis
	persist bool
}

// RedisClusterOptions configure StartRedisCluster.
type RedisClusterOptions struct {
	Dir     string // one sub-directory per node (created)
	Masters int    // 0: 3, the fewest redis-cli accepts
	// Persist turns appendonly on, so a node stopped and restarted
	// (Restart) comes back with its keys.
	Persist bool
}

// StartRedisCluster starts the masters on free ports, joins them with
// `redis-cli --cluster create` (slots spread evenly, no replicas) and waits
// until every node reports cluster_state:ok.
func StartRedisCluster(ctx context.Context, o RedisClusterOptions) (_ *RedisCluster, err error) {
	if o.Masters == 0 {
		o.Masters = 3
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return nil, fmt.Errorf("localsvc.StartRedisCluster: redis-cli %w (Debian/Ubuntu: apt-get install redis-tools)", ErrMissing)
	}
	c := &RedisCluster{persist: o.Persist}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	for i := range o.Masters {
		r, err := StartRedis(ctx, RedisOptions{Dir: filepath.Join(o.Dir, "node"+strconv.Itoa(i)), Cluster: true, Persist: o.Persist})
		if err != nil {
			return nil, fmt.Errorf("localsvc.StartRedisCluster: %w", err)
		}
		c.Nodes = append(c.Nodes, r)
		c.Addrs = append(c.Addrs, r.Addr)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	cmd := exec.CommandContext(ctx, cli, args...)
	cmd.Stdin = strings.NewReader("yes\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("localsvc.StartRedisCluster: redis-cli --cluster create: %w: %s", err, out)
	}
	if err := c.WaitOK(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// WaitOK waits until every running node reports cluster_state:ok (the
// nodes agree on the slot map after a create or a restart).
func (c *RedisCluster) WaitOK(ctx context.Context) error {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return fmt.Errorf("localsvc.RedisCluster.WaitOK: redis-cli %w", ErrMissing)
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for _, n := range c.Nodes {
		if n.cmd.ProcessState != nil {
			continue // stopped by a test
		}
		host, port, _ := strings.Cut(n.Addr, ":")
		for {
			out, err := exec.CommandContext(ctx, cli, "-h", host, "-p", port, "cluster", "info").Output()
			if err == nil && bytes.Contains(out, []byte("cluster_state:ok")) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("localsvc.RedisCluster.WaitOK: %s never reported cluster_state:ok: %w", n.Addr, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// Restart starts node i again on its port and directory (after a test
// stopped it) and waits for the cluster to be whole.
func (c *RedisCluster) Restart(ctx context.Context, i int) error {
	n := c.Nodes[i]
	n.Stop()
	_, port, err := splitAddr(n.Addr)
	if err != nil {
		return fmt.Errorf("localsvc.RedisCluster.Restart: %w", err)
	}
	p, _ := strconv.Atoi(port)
	r, err := StartRedis(ctx, RedisOptions{Dir: n.Dir, Port: p, Cluster: true, Persist: c.persist})
	if err != nil {
		return fmt.Errorf("localsvc.RedisCluster.Restart: %w", err)
	}
	c.Nodes[i] = r
	return c.WaitOK(ctx)
}

// freeClusterPort finds a free port for a cluster node: a node also
// listens on its port + 10000 (the cluster bus), so the port is at most
// 55535 and both are free.
func freeClusterPort() (int, error) {
	for range 200 {
		p, err := FreePort()
		if err != nil {
			return 0, err
		}
		if p > 55535 {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000))
		if err != nil {
			continue
		}
		l.Close()
		return p, nil
	}
	return 0, fmt.Errorf("no free port P with P+10000 free (the cluster bus)")
}

// Stop stops every node.
func (c *RedisCluster) Stop() {
	for _, n := range c.Nodes {
		n.Stop()
	}
}

// Sentinel is a running redis-sentinel.
type Sentinel struct {
	Addr string
	cmd  *exec.Cmd
}

// SentinelOptions configure StartSentinel.
type SentinelOptions struct {
	Dir        string // its config file and log (created)
	MasterName string
	MasterAddr string // host:port
	Quorum     int    // 0: 1
	Password   string // the data nodes' password, if any
}

// StartSentinel starts redis-sentinel monitoring one master and waits until
// it answers. Its failure detection is short so tests see a failover soon.
func StartSentinel(ctx context.Context, o SentinelOptions) (*Sentinel, error) {
	bin, err := exec.LookPath("redis-sentinel")
	if err != nil {
		return nil, fmt.Errorf("localsvc.StartSentinel: redis-sentinel %w (Debian/Ubuntu: apt-get install redis-sentinel)", ErrMissing)
	}
	if o.Dir, err = filepath.Abs(o.Dir); err != nil {
		return nil, fmt.Errorf("localsvc.StartSentinel: %w", err)
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("localsvc.StartSentinel: %w", err)
	}
	if o.Quorum == 0 {
		o.Quorum = 1
	}
	port, err := FreePort()
	if err != nil {
		return nil, fmt.Errorf("localsvc.StartSentinel: %w", err)
	}
	host, mport, err := splitAddr(o.MasterAddr)
	if err != nil {
		return nil, fmt.Errorf("localsvc.StartSentinel: %w", err)
	}
	conf := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\n"+
		"sentinel monitor %s %s %s %d\n"+
		"sentinel down-after-milliseconds %s 1000\n"+
		"sentinel failover-timeout %s 10000\n"+
		"sentinel parallel-syncs %s 1\n",
		port, o.Dir, filepath.Join(o.Dir, "sentinel.log"), o.MasterName, host, mport, o.Quorum,
		o.MasterName, o.MasterName, o.MasterName)
	if o.Password != "" {
		conf += fmt.Sprintf("sentinel auth-pass %s %s\n", o.MasterName, o.Password)
	}
	// Sentinel rewrites its config file, so it must be writable and its own.
	file := filepath.Join(o.Dir, "sentinel.conf")
	if err := os.WriteFile(file, []byte(conf), 0o644); err != nil {
		return nil, fmt.Errorf("localsvc.StartSentinel: %w", err)
	}
	cmd := exec.Command(bin, file)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("localsvc.StartSentinel: %w", err)
	}
	s := &Sentinel{Addr: "127.0.0.1:" + strconv.Itoa(port), cmd: cmd}
	if err := waitTCP(ctx, s.Addr, 10*time.Second); err != nil {
		s.Stop()
		return nil, fmt.Errorf("localsvc.StartSentinel: %w (log: %s)", err, filepath.Join(o.Dir, "sentinel.log"))
	}
	return s, nil
}

// Stop terminates redis-sentinel and waits for it.
func (s *Sentinel) Stop() {
	if s.cmd.Process == nil || s.cmd.ProcessState != nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}

func splitAddr(addr string) (host, port string, err error) {
	host, port, ok := strings.Cut(addr, ":")
	if !ok || host == "" || port == "" {
		return "", "", fmt.Errorf("%q is not host:port", addr)
	}
	return host, port, nil
}
