package e2e

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/loadtest"
)

// serverPIDs finds the process ids of the test's redis-server (INFO
// server's process_id) and PostgreSQL postmaster (the parent of a
// backend).
func serverPIDs(t *testing.T) map[string][]int {
	t.Helper()
	ctx := context.Background()
	info, err := testenv.Redis(t).Info(ctx, "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	var redisPID int
	for l := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "process_id:"); ok {
			redisPID, _ = strconv.Atoi(v)
		}
	}
	var backend int
	if err := testenv.Postgres(t).QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", backend))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	postmaster, _ := strconv.Atoi(f[1])
	if redisPID <= 0 || postmaster <= 1 {
		t.Fatalf("redis pid %d, postmaster pid %d (backend %d)", redisPID, postmaster, backend)
	}
	return map[string][]int{"redis": {redisPID}, "postgres": {postmaster}}
}

// TestCPUAgainstStack: a small run against the in-process stack, with
// the redis-server and the PostgreSQL postmaster named, reports the CPU
// of each, of the load tool (which here holds the in-process gateway,
// writer and expiry too), their sums and the per-1,000 figures, over a
// window inside the run.
func TestCPUAgainstStack(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	testenv.SkipOnCluster(t, "names one redis-server")
	st := startApp(t)
	cfg, err := loadtest.Scenario("smoke")
	if err != nil {
		t.Fatal(err)
	}
	cfg.BaseURL, cfg.AdminURL, cfg.JWTSecret = st.app.PublicURL, st.app.AdminURL, secret
	cfg.Redis.URL, cfg.DatabaseURL = st.redisURL, st.databaseURL
	cfg.Allocation = "race" // the window is opening to last reservation
	cfg.SourceAddrs = 8
	cfg.Duration = 45 * time.Second
	cfg.ServerPIDs = serverPIDs(t)
	r, err := loadtest.Run(context.Background(), cfg)
	if r == nil || err != nil {
		t.Fatalf("Run: %v", err)
	}
	c := r.CPU
	if c == nil {
		t.Fatal("no cpu section")
	}
	t.Logf("%s", c.Text())
	if c.Error != "" || len(c.Missing) > 0 {
		t.Fatalf("cpu error %q, missing %v", c.Error, c.Missing)
	}
	for _, role := range []string{"redis", "postgres", loadtest.RoleLoad} {
		if got := c.Roles[role]; got.Total <= 0 || got.Window < 0 || got.Window > got.Total {
			t.Errorf("role %s: %+v, want CPU over the run, the window's within it", role, got)
		}
	}
	if c.LastReservationFrom != "orders.created_at" || c.LastReservationMs < 0 {
		t.Errorf("last reservation %d ms from %q, want orders.created_at", c.LastReservationMs, c.LastReservationFrom)
	}
	if c.WindowStartMs < 0 || c.WindowEndMs < c.LastReservationMs || c.WindowEndMs > c.TotalMs {
		t.Errorf("window %d…%d ms, last reservation %d ms, run %d ms", c.WindowStartMs, c.WindowEndMs, c.LastReservationMs, c.TotalMs)
	}
	if c.Server.Total <= 0 || c.All.Total <= c.Server.Total || c.UnitsSold != 10 || c.Shoppers != 50 ||
		c.PerThousandUnits == nil || c.PerThousandUnits.All.Total <= c.PerThousandShoppers.All.Total {
		t.Errorf("sums %+v / %+v, per 1,000 units %+v, per 1,000 shoppers %+v", c.Server, c.All, c.PerThousandUnits, c.PerThousandShoppers)
	}
}
