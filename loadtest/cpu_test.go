package loadtest

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/harness/testenv"
)

func TestParseProcStat(t *testing.T) {
	tail := " 10 11 12 13 14 15 16 17 18 19 20"
	for _, tc := range []struct {
		name, line string
		want       procStat
		bad        bool
	}{
		{name: "plain", line: "42 (redis-server) S 7 42 42 0 -1 4194560 1 2 3 4 30 12 5 6" + tail,
			want: procStat{PPID: 7, Self: 42, Children: 11}},
		{name: "name with spaces and parentheses", line: "9 (a) b (c)) R 1 9 9 0 -1 0 0 0 0 0 100 200 3 4" + tail,
			want: procStat{PPID: 1, Self: 300, Children: 7}},
		{name: "only up to cstime", line: "9 (x) R 1 9 9 0 -1 0 0 0 0 0 1 2 3 4",
			want: procStat{PPID: 1, Self: 3, Children: 7}},
		{name: "no name", line: "9 x R 1 9 9 0 -1 0 0 0 0 0 1 2 3 4" + tail, bad: true},
		{name: "short", line: "9 (x) R 1 9 9", bad: true},
		{name: "not a number", line: "9 (x) R 1 9 9 0 -1 0 0 0 0 0 1 z 3 4" + tail, bad: true},
		{name: "negative time", line: "9 (x) R 1 9 9 0 -1 0 0 0 0 0 1 -2 3 4" + tail, bad: true},
		{name: "empty", line: "", bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseProcStat([]byte(tc.line))
			if tc.bad {
				if err == nil {
					t.Fatalf("parseProcStat(%q) = %+v, want an error", tc.line, got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parseProcStat(%q) = %+v, %v; want %+v", tc.line, got, err, tc.want)
			}
		})
	}
}

func FuzzParseProcStat(f *testing.F) {
	f.Add([]byte("42 (redis-server) S 7 42 42 0 -1 4194560 1 2 3 4 30 12 5 6 20 0 1 0 100"))
	f.Add([]byte("9 (a) b (c)) R 1 9 9 0 -1 0 0 0 0 0 100 200 3 4"))
	f.Add([]byte("9 ("))
	f.Add([]byte(")"))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := parseProcStat(b)
		if err == nil && (st.Self < 0 || st.Children < 0) {
			t.Fatalf("parseProcStat(%q) = %+v: negative CPU accepted", b, st)
		}
	})
}

func TestParseServerPIDs(t *testing.T) {
	got, err := ParseServerPIDs(" gateway=812,gateway=815, redis=640,postgres=700,")
	if err != nil {
		t.Fatal(err)
	}
	if g := got["gateway"]; len(g) != 2 || g[0] != 812 || g[1] != 815 || len(got["redis"]) != 1 || got["postgres"][0] != 700 {
		t.Fatalf("ParseServerPIDs = %v", got)
	}
	if got, err := ParseServerPIDs(""); err != nil || len(got) != 0 {
		t.Fatalf("ParseServerPIDs(\"\") = %v, %v; want none", got, err)
	}
	for _, bad := range []string{"gateway", "=12", "gateway=", "gateway=x", "gateway=-1", "gateway=0",
		"Gateway=12", "g w=12", "load=12", "a=12,b=12", "gateway=99999999999"} {
		if got, err := ParseServerPIDs(bad); err == nil {
			t.Errorf("ParseServerPIDs(%q) = %v, want an error", bad, got)
		}
	}
}

func FuzzParseServerPIDs(f *testing.F) {
	f.Add("gateway=812,gateway=815,redis=640")
	f.Add("load=1")
	f.Add("a=1,a=1")
	f.Add(",,=")
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseServerPIDs(s)
		if err != nil {
			return
		}
		seen := map[int]bool{}
		for role, pids := range m {
			if role == RoleLoad || role == "" {
				t.Fatalf("ParseServerPIDs(%q): role %q accepted", s, role)
			}
			for _, p := range pids {
				if p <= 0 || seen[p] {
					t.Fatalf("ParseServerPIDs(%q): pid %d accepted", s, p)
				}
				seen[p] = true
			}
		}
	})
}

func TestClockTicks(t *testing.T) {
	if hz := clockTicks(); hz <= 0 {
		t.Fatalf("clockTicks() = %d", hz)
	}
}

// TestProcessCPU reads this process's own CPU while it burns some: the
// figure grows, and lies between getrusage's before and after the read
// (give or take a clock tick, /proc's unit).
func TestProcessCPU(t *testing.T) {
	self := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	start, err := ProcessCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	tick := time.Second / time.Duration(clockTicks())
	x := 0
	for deadline := time.Now().Add(time.Minute); ; {
		for i := range 1_000_000 {
			x ^= i * i
		}
		before := self()
		got, err := ProcessCPU(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		after := self()
		if got < before-2*tick || got > after+2*tick {
			t.Fatalf("ProcessCPU = %v, getrusage %v before and %v after", got, before, after)
		}
		if got-start >= 5*tick {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ProcessCPU went from %v to %v in a minute of burning CPU (%d)", start, got, x)
		}
	}
	if _, err := ProcessCPU(1 << 30); err == nil {
		t.Fatal("ProcessCPU of a pid that cannot exist: no error")
	}
}

// TestProcTreeCountsChild reads the real /proc: a child that burns CPU
// shows under the test process's tree and grows; left out when named
// under a role of its own; once reaped, its CPU stays in the parent's
// cutime + cstime.
func TestProcTreeCountsChild(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	self := os.Getpid()
	tab, err := procTable("/proc")
	if err != nil {
		t.Fatal(err)
	}
	if st, ok := tab[self]; !ok || st.PPID != os.Getppid() {
		t.Fatalf("own stat = %+v (found %v), want ppid %d", st, ok, os.Getppid())
	}
	cmd := exec.Command("sh", "-c", "i=0; while :; do i=$((i+1)); done")
	if err := cmd.Start(); err != nil {
		t.Skip(err)
	}
	done := false
	t.Cleanup(func() {
		if !done {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	child := cmd.Process.Pid
	// The child's own figure grows (polled; the deadline only guards
	// against a hang).
	var first, childTicks int64 = -1, 0
	testenv.EventuallyF(t, func() string { return fmt.Sprintf("the busy child's CPU to grow from %d ticks", first) }, 60*time.Second, func() bool {
		var err error
		if tab, err = procTable("/proc"); err != nil {
			t.Fatal(err)
		}
		c, ok := treeTicks(tab, childrenOf(tab), child, nil)
		if !ok {
			t.Fatalf("child %d not in /proc", child)
		}
		if first < 0 {
			first = c
		}
		if c > first && c > 0 {
			childTicks = c
			// The child is in the test process's tree, and out of it
			// when named for a role of its own.
			all, _ := treeTicks(tab, childrenOf(tab), self, nil)
			without, _ := treeTicks(tab, childrenOf(tab), self, map[int]bool{child: true})
			if all-without != c {
				t.Fatalf("tree with the child − tree without = %d ticks, want the child's %d", all-without, c)
			}
			return true
		}
		return false
	})
	before := tab[self].Children
	cmd.Process.Kill()
	cmd.Wait()
	done = true
	tab, err = procTable("/proc")
	if err != nil {
		t.Fatal(err)
	}
	if got := tab[self].Children - before; got < childTicks {
		t.Errorf("reaped children's CPU grew by %d ticks, want at least the child's %d", got, childTicks)
	}
}

// fakeSampler is a sampler of two gateways (pids 10 and 11), a Redis (20)
// and the tool itself (1) whose snapshots are added by snap, at ms from
// opens, with each process's ticks.
func fakeSampler(opens time.Time) (*cpuSampler, func(ms int, self, g1, g2, r int64)) {
	s := newCPUSampler("/nonexistent", 1, map[string][]int{"gateway": {10, 11}, "redis": {20}})
	return s, func(ms int, self, g1, g2, r int64) {
		at := opens.Add(time.Duration(ms) * time.Millisecond)
		s.snaps = append(s.snaps, cpuSnapshot{at: at, ticks: map[int]int64{1: self, 10: g1, 11: g2, 20: r}})
	}
}

// nearly fails t when got is not want to 1e-9.
func nearly(t *testing.T, name string, got, want float64) {
	t.Helper()
	if d := got - want; d > 1e-9 || d < -1e-9 {
		t.Errorf("%s = %v, want %v", name, got, want)
	}
}

// TestCPUWindow: the window runs from the first snapshot at or after the
// opening to the first at or after the last reservation; the total from
// the first snapshot to the last; the sums and the per-1,000 figures
// follow.
func TestCPUWindow(t *testing.T) {
	opens := time.Unix(1000, 0)
	s, snap := fakeSampler(opens)
	snap(-5000, 0, 0, 0, 0) // the run's start
	snap(3, 100, 100, 100, 100)
	snap(103, 110, 130, 140, 150)
	snap(203, 120, 160, 180, 200) // first at or after the last reservation (150 ms)
	snap(303, 130, 190, 220, 250)
	snap(9000, 200, 300, 400, 500) // the run's end
	r := s.report(opens, 150, "orders.created_at", 2000, 500, 100, -1, 0)
	if r.WindowStartMs != 3 || r.WindowEndMs != 203 || r.TotalMs != 14000 {
		t.Fatalf("window %d…%d ms, total %d ms; want 3…203, 14000", r.WindowStartMs, r.WindowEndMs, r.TotalMs)
	}
	near := func(name string, got, want float64) { t.Helper(); nearly(t, name, got, want) }
	near("gateway window", r.Roles["gateway"].Window, 1.4) // (160−100)+(180−100) ticks
	near("gateway total", r.Roles["gateway"].Total, 7)
	if ps := r.Roles["gateway"].Processes; len(ps) != 2 || ps[0].PID != 10 || ps[1].PID != 11 {
		t.Fatalf("gateway processes = %+v", ps)
	} else {
		near("gateway 11 window", ps[1].Window, 0.8)
		near("gateway 11 total", ps[1].Total, 4)
	}
	near("redis window", r.Roles["redis"].Window, 1)
	near("load window", r.Load.Window, 0.2)
	near("server window", r.Server.Window, 2.4)
	near("all total", r.All.Total, 14)
	near("per 1,000 shoppers, all window", r.PerThousandShoppers.All.Window, 1.3)
	near("per 1,000 units, server total", r.PerThousandUnits.Server.Total, 24)
	if len(r.Missing) != 0 || r.Error != "" {
		t.Errorf("missing %v, error %q", r.Missing, r.Error)
	}

	// A last reservation before the opening's snapshot was taken (at 1
	// ms; the snapshot came at 3): the window ends one snapshot on.
	if r := s.report(opens, 1, "orders.created_at", 2000, 500, 100, -1, 0); r.WindowStartMs != 3 || r.WindowEndMs != 103 {
		t.Errorf("reservation before the first snapshot: window %d…%d ms, want 3…103", r.WindowStartMs, r.WindowEndMs)
	}
	// A last reservation after every snapshot of the drop: the window
	// ends at the last snapshot. None: no window.
	if r := s.report(opens, 9500, "client 202", 2000, 500, 100, -1, 0); r.WindowEndMs != 9000 {
		t.Errorf("late last reservation: window end %d ms, want 9000", r.WindowEndMs)
	}
	if r := s.report(opens, -1, "client 202", 2000, 0, 100, -1, 0); r.WindowEndMs != -1 || r.Roles["redis"].Window != 0 || r.PerThousandUnits != nil {
		t.Errorf("no reservation: %+v", r)
	}

	// A process gone by the end is named and left out of the sums.
	s.snaps = append(s.snaps, cpuSnapshot{at: opens.Add(9100 * time.Millisecond), ticks: map[int]int64{1: 210, 10: 310, 11: 410}})
	r = s.report(opens, 150, "client 202", 2000, 500, 100, -1, 0)
	if len(r.Missing) != 1 || r.Missing[0] != "redis 20" || r.Roles["redis"].Total != 0 {
		t.Errorf("missing %v, redis %+v; want redis 20 left out", r.Missing, r.Roles["redis"])
	}
	if txt := r.Text(); !strings.Contains(txt, "(2 processes: 10 0.60/3.10, 11 0.80/4.10)") || !strings.Contains(txt, "redis 20") {
		t.Errorf("text:\n%s", txt)
	}
}

// TestCPUJoins: the joins' window runs from the run's first snapshot to
// the first at or after the last join, by role, and per join; none when
// that snapshot comes after the opening or a process is missing from it.
func TestCPUJoins(t *testing.T) {
	opens := time.Unix(1000, 0)
	s, snap := fakeSampler(opens)
	snap(-10000, 0, 0, 0, 0) // the run's start
	snap(-9000, 50, 100, 100, 10)
	snap(-8000, 90, 200, 250, 20) // first at or after the last join (1,500 ms from the start)
	snap(-7000, 95, 201, 251, 21)
	snap(3, 100, 300, 300, 100)
	snap(9000, 200, 400, 400, 200)
	r := s.report(opens, 3, "client 202", 1000, 10, 100, 1500, 1000)
	j := r.Joins
	if j == nil {
		t.Fatal("no joins window")
	}
	if j.EndMs != 2000 || j.LastJoinMs != 1500 || j.Joined != 1000 {
		t.Fatalf("joins %+v; want the window to end 2,000 ms after the start", j)
	}
	near := func(name string, got, want float64) { t.Helper(); nearly(t, name, got, want) }
	near("gateway", j.Roles["gateway"], 4.5) // 200 + 250 ticks
	near("redis", j.Roles["redis"], 0.2)
	near("server", j.Server, 4.7)
	near("load", j.Load, 0.9)
	near("per join", j.ServerPerJoinUs, 4700)
	if txt := r.Text(); !strings.Contains(txt, "cpu joins: the run's start to the snapshot 2000 ms after it (last join 1500 ms): 1000 joined; server 4.70 s (gateway 4.50, redis 0.20), 4700 us per join; load 0.90 s") {
		t.Errorf("text:\n%s", txt)
	}

	// Joins into the opening: the window would hold the opening's work.
	if r := s.report(opens, 3, "client 202", 1000, 10, 100, 10001, 1000); r.Joins != nil {
		t.Errorf("joins past the opening: %+v, want none", r.Joins)
	}
	if r := s.report(opens, 3, "client 202", 1000, 10, 100, -1, 0); r.Joins != nil {
		t.Errorf("no join: %+v, want none", r.Joins)
	}
	// A process missing at the window's end: no sum.
	delete(s.snaps[2].ticks, 20)
	if r := s.report(opens, 3, "client 202", 1000, 10, 100, 1500, 1000); r.Joins != nil {
		t.Errorf("a process missing: %+v, want none", r.Joins)
	}
}

// TestLastJoinFromTheTimeseries: the end of the last slot with a join
// outcome, whatever the join's answer.
func TestLastJoinFromTheTimeseries(t *testing.T) {
	r := &Report{Timeseries: []Slot{
		{TMs: 0, Outcomes: map[string]int64{"join PREQUEUE": 3}},
		{TMs: 100, Outcomes: map[string]int64{"join WAITING": 1, "purchase 202": 2}},
		{TMs: 200, Outcomes: map[string]int64{"purchase 202": 5}},
		{TMs: 300},
	}}
	if got := r.lastJoinMs(); got != 200 {
		t.Errorf("lastJoinMs = %d, want 200", got)
	}
	if got := (&Report{Timeseries: []Slot{{TMs: 0, Outcomes: map[string]int64{"purchase 202": 1}}}}).lastJoinMs(); got != -1 {
		t.Errorf("no join: lastJoinMs = %d, want -1", got)
	}
}

func BenchmarkCPUSnap(b *testing.B) {
	s := newCPUSampler("/proc", os.Getpid(), nil)
	for b.Loop() {
		s.snap(time.Now())
	}
}
