package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/auth"
	"github.com/flashsale/flashsale/internal/harness/localsvc"
	"github.com/flashsale/flashsale/internal/harness/testenv"
)

// devProc is `flashsale dev` in a process of its own.
type devProc struct {
	cmd  *exec.Cmd
	log  *lockedWriter
	done chan struct{} // closed when the process has exited
}

func startDev(t *testing.T, env []string, args string) *devProc {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(append(os.Environ(), env...), mainArgsEnv+"=dev "+args)
	p := &devProc{cmd: cmd, log: &lockedWriter{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	return p
}

// call is one JSON request to the dev stack.
func call(t *testing.T, method, url, bearer string, hdr ...string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	var body map[string]any
	_ = json.Unmarshal(b, &body)
	return r.StatusCode, body
}

// TestDevRestartKeepsAcknowledgedOrders: an order acknowledged by
// `flashsale dev` (202) is still in its embedded broker after the process
// is killed with -9 and started again, and the restarted writer stores it.
func TestDevRestartKeepsAcknowledgedOrders(t *testing.T) {
	var ports [3]int
	for i := range ports {
		p, err := localsvc.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = p
	}
	const secret = "dev-restart-secret-0123456789abcdef"
	env := []string{
		"FLASHSALE_REDIS_URL=" + testenv.RedisURL(t),
		"FLASHSALE_DATABASE_URL=" + testenv.DatabaseURL(t),
		"FLASHSALE_JWT_SECRET=" + secret,
		fmt.Sprintf("FLASHSALE_HTTP_ADDR=127.0.0.1:%d", ports[0]),
		fmt.Sprintf("FLASHSALE_ADMIN_ADDR=127.0.0.1:%d", ports[1]),
		fmt.Sprintf("FLASHSALE_KAFKA_PORT=%d", ports[2]),
	}
	args := "--data-dir " + t.TempDir()
	api := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	ready := func(p *devProc) {
		t.Helper()
		if !testenv.Wait(60*time.Second, func() bool {
			st, _ := call(t, "GET", fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[1]), "")
			return st == 200
		}) {
			t.Fatalf("flashsale dev not ready within 60s:\n%s", p.log)
		}
	}
	mint := func(user int64, op bool) string {
		tok, err := auth.Mint(secret, user, op, time.Hour, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}

	dev := startDev(t, env, args)
	ready(dev)
	req, _ := http.NewRequest("POST", api+"/api/admin/sales", strings.NewReader(fmt.Sprintf(
		`{"name": "restart", "startsAt": %q, "admissionRatePerSecond": 100, "allocation": "race", "items": [{"productId": 1, "quantity": 3, "priceCents": 500}]}`,
		time.Now().Add(-time.Second).UTC().Format(time.RFC3339))))
	req.Header.Set("Authorization", "Bearer "+mint(1, true))
	req.Header.Set("Content-Type", "application/json")
	r, err := http.DefaultClient.Do(req)
	if err != nil || r.StatusCode != 201 {
		t.Fatalf("create sale: %v %v", r, err)
	}
	var sale struct {
		ID    int64 `json:"id"`
		Items []struct {
			ID int64 `json:"id"`
		} `json:"items"`
	}
	_ = json.NewDecoder(r.Body).Decode(&sale)
	r.Body.Close()

	shopper := mint(42, false)
	queue := fmt.Sprintf("%s/api/flash-sales/sales/%d/queue", api, sale.ID)
	if st, body := call(t, "POST", queue, shopper); st != 200 {
		t.Fatalf("join: %d %v", st, body)
	}
	var admission string
	if !testenv.Wait(20*time.Second, func() bool {
		_, body := call(t, "GET", queue, shopper)
		admission, _ = body["admissionToken"].(string)
		return admission != ""
	}) {
		t.Fatal("not admitted within 20s")
	}
	st, body := call(t, "POST", fmt.Sprintf("%s/api/flash-sales/items/%d/purchase", api, sale.Items[0].ID), shopper, "X-Admission-Token", admission)
	if st != 202 {
		t.Fatalf("purchase: %d %v", st, body)
	}
	orderID := body["orderId"].(string)

	if err := dev.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-dev.done

	dev = startDev(t, env, args)
	ready(dev)
	// The acknowledged record is in the restarted broker.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(fmt.Sprintf("127.0.0.1:%d", ports[2])), kgo.ConsumeTopics(flashsale.TopicOrders),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for found := false; !found; {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("order %s acknowledged before the kill is not in the broker after the restart", orderID)
		}
		fs.EachRecord(func(rec *kgo.Record) { found = found || strings.Contains(string(rec.Value), orderID) })
	}
	if !testenv.Wait(30*time.Second, func() bool {
		_, body := call(t, "GET", api+"/api/flash-sales/orders/"+orderID, shopper)
		return body["payable"] == true
	}) {
		t.Fatalf("order %s not stored by the restarted dev within 30s", orderID)
	}
}
