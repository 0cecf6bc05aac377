// Package localsvc starts the machine's redis-server and PostgreSQL as child
// processes, for `flashsale dev` and the test harness. Nothing here is used in
// production, where the services are configured by URL.
package localsvc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// PostgresBinDirs are searched for initdb and pg_ctl, newest first.
var postgresBinDirs = []string{
	"/usr/lib/postgresql/17/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/15/bin",
	"/usr/lib/postgresql/14/bin", "/usr/lib/postgresql/13/bin",
}

// ErrMissing is returned when a server binary is not installed.
var ErrMissing = errors.New("not installed")

// FreePort asks the kernel for a free TCP port on 127.0.0.1.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Redis is a running redis-server.
type Redis struct {
	URL  string
	Addr string
	Dir  string
	cmd  *exec.Cmd
}

// RedisOptions configure StartRedis.
type RedisOptions struct {
	Dir       string // data and log directory (created)
	Port      int    // 0: a free port
	Databases int    // 0: 16
	Persist   bool   // appendonly on (dev); off for tests
	// Cluster starts the node with cluster mode on (its nodes.conf in Dir);
	// StartRedisCluster joins such nodes into one cluster.
	Cluster bool
	// Password, when set, is required of every client (requirepass).
	Password string
	// ReplicaOf is the host:port of a master to replicate (a Sentinel
	// set-up's replica).
	ReplicaOf string
}

// StartRedis starts redis-server and waits until it answers.
func StartRedis(ctx context.Context, o RedisOptions) (*Redis, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("localsvc.StartRedis: redis-server %w (Debian/Ubuntu: apt-get install redis-server)", ErrMissing)
	}
	if o.Dir, err = filepath.Abs(o.Dir); err != nil {
		return nil, fmt.Errorf("localsvc.StartRedis: %w", err)
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("localsvc.StartRedis: %w", err)
	}
	if o.Port == 0 && o.Cluster {
		if o.Port, err = freeClusterPort(); err != nil {
			return nil, fmt.Errorf("localsvc.StartRedis: %w", err)
		}
	}
	if o.Port == 0 {
		if o.Port, err = FreePort(); err != nil {
			return nil, fmt.Errorf("localsvc.StartRedis: %w", err)
		}
	}
	if o.Databases == 0 {
		o.Databases = 16
	}
	args := []string{
		"--port", strconv.Itoa(o.Port), "--bind", "127.0.0.1", "--dir", o.Dir,
		"--databases", strconv.Itoa(o.Databases), "--save", "", "--daemonize", "no",
		"--logfile", filepath.Join(o.Dir, "redis.log"), "--maxclients", "10000",
	}
	if o.Persist {
		args = append(args, "--appendonly", "yes", "--appendfsync", "everysec")
	} else {
		args = append(args, "--appendonly", "no")
	}
	if o.Cluster {
		// A short node timeout so a test's stopped node is marked failed
		// soon; there are no replicas to promote.
		args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(o.Dir, "nodes.conf"),
			"--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "yes")
	}
	if o.Password != "" {
		args = append(args, "--requirepass", o.Password, "--masterauth", o.Password)
	}
	if o.ReplicaOf != "" {
		host, port, err := net.SplitHostPort(o.ReplicaOf)
		if err != nil {
			return nil, fmt.Errorf("localsvc.StartRedis: ReplicaOf: %w", err)
		}
		args = append(args, "--replicaof", host, port)
	}
	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("localsvc.StartRedis: %w", err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(o.Port)
	r := &Redis{URL: "redis://" + addr + "/0", Addr: addr, Dir: o.Dir, cmd: cmd}
	if err := waitTCP(ctx, addr, 10*time.Second); err != nil {
		r.Stop()
		return nil, fmt.Errorf("localsvc.StartRedis: %w (log: %s)", err, filepath.Join(o.Dir, "redis.log"))
	}
	return r, nil
}

// Stop terminates redis-server and waits for it.
func (r *Redis) Stop() error {
	if r.cmd.Process == nil {
		return nil
	}
	_ = r.cmd.Process.Signal(os.Interrupt)
	done := make(chan error, 1)
	go func() { done <- r.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = r.cmd.Process.Kill()
		<-done
	}
	return nil
}

// Signal sends sig to redis-server (SIGSTOP and SIGCONT: a frozen Redis).
func (r *Redis) Signal(sig os.Signal) error {
	if r.cmd.Process == nil {
		return os.ErrProcessDone
	}
	return r.cmd.Process.Signal(sig)
}

// Kill stops redis-server at once, without saving (tests of Redis loss).
func (r *Redis) Kill() {
	if r.cmd.Process != nil {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
	}
}

// Postgres is a running PostgreSQL cluster.
type Postgres struct {
	// URL connects as the superuser "postgres" to the database "postgres".
	URL  string
	Port int
	dir  string
	bin  string
	asPG bool
}

// PostgresOptions configure StartPostgres.
type PostgresOptions struct {
	Dir  string // cluster directory; initialised when empty
	Port int    // 0: a free port
	// Fast turns fsync off (tests only), and synchronous_commit with it
	// unless SyncCommit is set.
	Fast bool
	// SyncCommit keeps synchronous_commit on under Fast: a commit returns
	// only once its WAL record is written out, so a server killed at any
	// moment comes back with every commit it acknowledged (fsync stays
	// off: that guards against the machine's crash, not the process's).
	// Crash tests run on such a server.
	SyncCommit bool
}

func findPostgresBin() (string, error) {
	for _, d := range postgresBinDirs {
		if _, err := os.Stat(filepath.Join(d, "pg_ctl")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", fmt.Errorf("PostgreSQL server binaries %w (Debian/Ubuntu: apt-get install postgresql)", ErrMissing)
}

// StartPostgres initialises (when needed) and starts a PostgreSQL cluster.
// PostgreSQL refuses to run as root, so as root it runs as the "postgres"
// user through runuser.
func StartPostgres(ctx context.Context, o PostgresOptions) (*Postgres, error) {
	bin, err := findPostgresBin()
	if err != nil {
		return nil, fmt.Errorf("localsvc.StartPostgres: %w", err)
	}
	p := &Postgres{dir: o.Dir, bin: bin, asPG: os.Geteuid() == 0}
	pickPort := o.Port == 0
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("localsvc.StartPostgres: %w", err)
	}
	if p.asPG {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("localsvc.StartPostgres: running as root needs a 'postgres' user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		// The parents must be traversable by postgres.
		for d := o.Dir; d != "/" && d != "."; d = filepath.Dir(d) {
			if st, err := os.Stat(d); err == nil && st.Mode().Perm()&0o001 == 0 && d != o.Dir {
				_ = os.Chmod(d, st.Mode().Perm()|0o011)
			}
		}
		if err := os.Chown(o.Dir, uid, gid); err != nil {
			return nil, fmt.Errorf("localsvc.StartPostgres: %w", err)
		}
	}
	if _, err := os.Stat(filepath.Join(o.Dir, "PG_VERSION")); err != nil {
		if out, err := p.run(ctx, "initdb", "-D", o.Dir, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"); err != nil {
			return nil, fmt.Errorf("localsvc.StartPostgres: initdb: %w: %s", err, out)
		}
	}
	// A free port may be taken by another process (parallel test
	// packages each start a cluster) before PostgreSQL binds it: with a
	// port of our choosing, try again on another.
	logFile := filepath.Join(o.Dir, "server.log")
	for attempt := 1; ; attempt++ {
		if pickPort {
			if o.Port, err = FreePort(); err != nil {
				return nil, fmt.Errorf("localsvc.StartPostgres: %w", err)
			}
		}
		p.Port = o.Port
		opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c max_connections=300", o.Port, o.Dir)
		if o.Fast {
			opts += " -c fsync=off -c full_page_writes=off"
			if !o.SyncCommit {
				opts += " -c synchronous_commit=off"
			}
		}
		out, err := p.run(ctx, "pg_ctl", "-D", o.Dir, "-o", opts, "-l", logFile, "-w", "-t", "60", "start")
		if err == nil {
			break
		}
		if !pickPort || attempt == 3 || ctx.Err() != nil {
			return nil, fmt.Errorf("localsvc.StartPostgres: pg_ctl start (attempt %d): %w: %s\nserver.log:\n%s", attempt, err, out, tail(logFile, 20))
		}
	}
	p.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", o.Port)
	return p, nil
}

// tail returns the last n lines of file ("" when unreadable).
func tail(file string, n int) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func (p *Postgres) run(ctx context.Context, prog string, args ...string) (string, error) {
	path := filepath.Join(p.bin, prog)
	var cmd *exec.Cmd
	if p.asPG {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, path, args...)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Dir = "/"
	err := cmd.Run()
	return strings.TrimSpace(out.String()), err
}

// DatabaseURL is the URL of another database on the same cluster.
func (p *Postgres) DatabaseURL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", p.Port, db)
}

// Stop shuts the cluster down (fast mode) and waits.
func (p *Postgres) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := p.run(ctx, "pg_ctl", "-D", p.dir, "-m", "fast", "-w", "stop"); err != nil {
		return fmt.Errorf("localsvc.Postgres.Stop: %w: %s", err, out)
	}
	return nil
}

func waitTCP(ctx context.Context, addr string, max time.Duration) error {
	deadline := time.Now().Add(max)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer within %s: %w", addr, max, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
