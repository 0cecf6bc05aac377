package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/harness/localsvc"
)

// brokerProc is `flashsale broker` running as a process of its own.
type brokerProc struct {
	cmd    *exec.Cmd
	addr   string
	stderr *lockedWriter
	done   chan struct{} // closed when the process has exited; then err is set
	err    error
}

// startBrokerProc runs the broker subcommand in a child process (this test
// binary, see mainArgsEnv) and waits for the address it prints.
func startBrokerProc(t *testing.T, args string) *brokerProc {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), mainArgsEnv+"=broker --log-format text "+args)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &brokerProc{cmd: cmd, stderr: &lockedWriter{}, done: make(chan struct{})}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		for sc.Scan() {
		}
		p.err = cmd.Wait()
		close(p.done)
	}()
	select {
	case line, ok := <-lines:
		if !ok {
			t.Fatalf("broker exited before printing its address: %s", p.stderr)
		}
		p.addr = strings.TrimSpace(line)
	case <-time.After(30 * time.Second):
		t.Fatalf("broker printed no address within 30s: %s", p.stderr)
	}
	return p
}

// lockedWriter collects a child's stderr, written by exec's copying
// goroutine and read by the test.
type lockedWriter struct {
	mu sync.Mutex
	w  bytes.Buffer
}

func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.String()
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// TestBrokerSurvivesKill produces through `flashsale broker`, kills it with
// -9, starts it again on the same port and data directory, produces more
// with the same client, and reads every acknowledged record back; then
// SIGTERM stops it cleanly.
func TestBrokerSurvivesKill(t *testing.T) {
	port, err := localsvc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	args := fmt.Sprintf("--port %d --data-dir %s --partitions 4", port, t.TempDir())
	b := startBrokerProc(t, args)
	if want := fmt.Sprintf("127.0.0.1:%d", port); b.addr != want {
		t.Fatalf("broker address %q, want %q", b.addr, want)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	prod, err := kgo.NewClient(kgo.SeedBrokers(b.addr), kgo.RequiredAcks(kgo.AllISRAcks()), kgo.DefaultProduceTopic(flashsale.TopicOrders))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	const n = 400
	acked := make(map[string]bool, n)
	produce := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			v := fmt.Sprintf("order-%d", i)
			rec := &kgo.Record{Key: []byte(fmt.Sprint(i % 7)), Value: []byte(v)}
			if err := prod.ProduceSync(ctx, rec).FirstErr(); err != nil {
				t.Fatalf("produce %d: %v", i, err)
			}
			acked[v] = true
		}
	}
	produce(0, 300)

	if err := b.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-b.done

	b = startBrokerProc(t, args)
	// The same idempotent producer (a gateway that was not restarted)
	// goes on producing through the restarted broker.
	produce(300, n)
	cons, err := kgo.NewClient(kgo.SeedBrokers(b.addr), kgo.ConsumeTopics(flashsale.TopicOrders), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	seen := 0
	for seen < n {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d acknowledged records back after kill -9 and restart", seen, n)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if acked[string(r.Value)] {
				delete(acked, string(r.Value))
				seen++
			}
		})
	}

	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.done:
		if b.err != nil {
			t.Fatalf("broker after SIGTERM: %v: %s", b.err, b.stderr)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("broker still running 30s after SIGTERM")
	}
	if !strings.Contains(b.stderr.String(), "stopped") {
		t.Fatalf("broker log after SIGTERM: %s", b.stderr)
	}
}
