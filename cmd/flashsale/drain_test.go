package main

import (
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/harness/localsvc"
	"github.com/flashsale/flashsale/internal/harness/testenv"
)

// TestDrainOnSIGTERM: after SIGTERM a real `flashsale dev` answers /readyz
// 503 at once while its public port still answers requests, for the drain
// period; then it exits 0.
func TestDrainOnSIGTERM(t *testing.T) {
	var ports [3]int
	for i := range ports {
		p, err := localsvc.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = p
	}
	// The period only has to outlast the few requests below; the test
	// waits for conditions, not for the period.
	env := []string{
		"FLASHSALE_REDIS_URL=" + testenv.RedisURL(t),
		"FLASHSALE_DATABASE_URL=" + testenv.DatabaseURL(t),
		"FLASHSALE_JWT_SECRET=drain-secret-0123456789abcdef-drain",
		"FLASHSALE_DRAIN_PERIOD=10s",
		fmt.Sprintf("FLASHSALE_HTTP_ADDR=127.0.0.1:%d", ports[0]),
		fmt.Sprintf("FLASHSALE_ADMIN_ADDR=127.0.0.1:%d", ports[1]),
		fmt.Sprintf("FLASHSALE_KAFKA_PORT=%d", ports[2]),
	}
	api := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	readyz := fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[1])
	dev := startDev(t, env, "--data-dir "+t.TempDir())
	// Ready, and started: the banner comes once every role runs.
	if !testenv.Wait(60*time.Second, func() bool {
		st, _ := call(t, "GET", readyz, "")
		return st == 200 && strings.Contains(dev.log.String(), "flashsale dev is running")
	}) {
		t.Fatalf("flashsale dev not ready within 60s:\n%s", dev.log)
	}
	if err := dev.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if !testenv.Wait(10*time.Second, func() bool { st, _ := call(t, "GET", readyz, ""); return st == 503 }) {
		t.Fatalf("/readyz did not turn 503 after SIGTERM:\n%s", dev.log)
	}
	select {
	case <-dev.done:
		t.Fatalf("exited before draining:\n%s", dev.log)
	default:
	}
	if st, body := call(t, "GET", api+"/api/flash-sales/sales", ""); st != 200 {
		t.Fatalf("public port while draining: %d %v\n%s", st, body, dev.log)
	}
	select {
	case <-dev.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("still running 60s after SIGTERM:\n%s", dev.log)
	}
	if code := dev.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0:\n%s", code, dev.log)
	}
	if st, _ := call(t, "GET", api+"/api/flash-sales/sales", ""); st != 0 {
		t.Fatalf("public port still answers after exit: %d", st)
	}
}

// TestDevBannerPrintsNoSecret: flashsale dev --demo without a JWT secret
// makes one and prints only the sign-in links: no secret and no bare
// token, and the operator's link signs the operator in.
func TestDevBannerPrintsNoSecret(t *testing.T) {
	ports := make([]int, 3)
	for i := range ports {
		p, err := localsvc.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = p
	}
	env := []string{
		"FLASHSALE_REDIS_URL=" + testenv.RedisURL(t),
		"FLASHSALE_DATABASE_URL=" + testenv.DatabaseURL(t),
		"FLASHSALE_JWT_SECRET=",
		fmt.Sprintf("FLASHSALE_HTTP_ADDR=127.0.0.1:%d", ports[0]),
		fmt.Sprintf("FLASHSALE_ADMIN_ADDR=127.0.0.1:%d", ports[1]),
		fmt.Sprintf("FLASHSALE_KAFKA_PORT=%d", ports[2]),
	}
	api := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	dev := startDev(t, env, "--demo --data-dir "+t.TempDir())
	link := regexp.MustCompile(`operator +\S+/operator#token=(\S+)`)
	if !testenv.Wait(60*time.Second, func() bool { return strings.Contains(dev.log.String(), "Ctrl-C stops") }) {
		t.Fatalf("flashsale dev --demo not up within 60s:\n%s", dev.log)
	}
	out := dev.log.String()
	m := link.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no operator sign-in link in the banner:\n%s", out)
	}
	for _, bad := range []string{"FLASHSALE_JWT_SECRET=", "shopper token", "operator token"} {
		if strings.Contains(out, bad) {
			t.Errorf("the banner prints %q:\n%s", bad, out)
		}
	}
	if strings.Count(out, m[1]) != 1 {
		t.Errorf("the operator's token is printed outside its link:\n%s", out)
	}
	if st, body := call(t, "GET", api+"/api/admin/sales", m[1]); st != 200 {
		t.Fatalf("the operator link's token: %d %v", st, body)
	}
}
