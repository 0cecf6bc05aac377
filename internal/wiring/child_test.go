package wiring_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/wiring"
)

// A test may run parts of flashsale as processes of their own, to freeze
// (SIGSTOP) or kill (-9) them: this test binary, started with childEnv set,
// runs that part instead of the tests (TestMain) until SIGTERM.
const (
	childEnv       = "FLASHSALE_TEST_CHILD"        // "gateway"
	childConfigEnv = "FLASHSALE_TEST_CHILD_CONFIG" // a childConfig as JSON
)

// childConfig configures a child process.
type childConfig struct {
	RedisURL     string   `json:"redisUrl,omitempty"`
	DatabaseURL  string   `json:"databaseUrl,omitempty"`
	KafkaBrokers []string `json:"kafkaBrokers,omitempty"`
	JWTSecret    string   `json:"jwtSecret,omitempty"`
}

// runChild runs the part childEnv names, if any, and exits; it returns
// when this is no child.
func runChild() {
	role := os.Getenv(childEnv)
	if role == "" {
		return
	}
	var cc childConfig
	if err := json.Unmarshal([]byte(os.Getenv(childConfigEnv)), &cc); err != nil {
		log.Fatalf("child %s: config: %v", role, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	switch role {
	case "gateway":
		cfg := wiring.Defaults()
		cfg.HTTPAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0"
		cfg.RedisURL, cfg.DatabaseURL, cfg.KafkaBrokers, cfg.JWTSecret = cc.RedisURL, cc.DatabaseURL, cc.KafkaBrokers, cc.JWTSecret
		// As apptest.Start's gateways.
		cfg.DrawLead, cfg.OpeningHold, cfg.MaxPendingConnsPerAddr = 0, -1, -1
		a, err := wiring.Start(ctx, cfg, wiring.Roles{Gateway: true}, logger)
		if err != nil {
			log.Fatalf("child gateway: %v", err)
		}
		fmt.Println(a.PublicURL + " " + a.AdminURL)
		<-ctx.Done()
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = a.Close(cctx)
		cancel()
	default:
		log.Fatalf("unknown child %q", role)
	}
	os.Exit(0)
}

// child is a part of flashsale running as a process of its own.
type child struct {
	cmd *exec.Cmd
	// addrs is what it printed first: the broker's addresses, or the
	// gateway's public and admin URLs.
	addrs []string
	log   *lockedBuffer
	done  chan struct{}
}

// lockedBuffer collects a child's log.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startChild starts role with cc and waits for the line it prints once
// ready. The test's cleanup wakes and kills it; its log is shown when the
// test failed.
func startChild(t *testing.T, role string, cc childConfig) *child {
	t.Helper()
	j, err := json.Marshal(cc)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+role, childConfigEnv+"="+string(j))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, log: &lockedBuffer{}, done: make(chan struct{})}
	cmd.Stderr = c.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1)
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		for sc.Scan() {
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		<-c.done
		if t.Failed() {
			t.Logf("%s log:\n%s", role, c.log.String())
		}
	})
	select {
	case line, ok := <-lines:
		if !ok {
			t.Fatalf("%s exited before it was ready:\n%s", role, c.log.String())
		}
		c.addrs = strings.Fields(strings.ReplaceAll(line, ",", " "))
	case <-time.After(60 * time.Second):
		t.Fatalf("%s not ready within 60s:\n%s", role, c.log.String())
	}
	return c
}

// signal sends sig to the child.
func (c *child) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
}
