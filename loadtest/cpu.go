package loadtest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The CPU cost of a run is read from /proc (Linux): for each process,
// utime + stime of /proc/<pid>/stat (its own CPU) plus cutime + cstime
// (the CPU of the children it has reaped, so a PostgreSQL backend that
// exited during the window still counts for the postmaster), plus the same
// of each live descendant that is not itself a named process. The figures
// are clock ticks; the tick rate is the kernel's AT_CLKTCK (sysconf
// CLK_TCK), read from /proc/self/auxv, 100 when it cannot be read.

// RoleLoad is the role of the load tool itself and its worker processes.
const RoleLoad = "load"

// cpuSampleEvery is the snapshot interval during the drop: the window's end
// is the first snapshot at or after the last reservation, so the window is
// accurate to it.
const cpuSampleEvery = 100 * time.Millisecond

// cpuSampleBefore is the snapshot interval before the opening: the joins'
// window ends at the first snapshot at or after the last join.
const cpuSampleBefore = time.Second

// procStat is what the CPU figures need of one /proc/<pid>/stat line.
type procStat struct {
	PPID     int
	Self     int64 // utime + stime, ticks
	Children int64 // cutime + cstime of reaped children, ticks
}

// parseProcStat parses a /proc/<pid>/stat line. The command name (field 2)
// is in parentheses and may itself hold spaces and parentheses, so the
// fields are counted from the last ')'. It does not allocate: a snapshot
// reads every process's line, and each one runs during the drop.
func parseProcStat(b []byte) (procStat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || bytes.IndexByte(b, '(') < 0 {
		return procStat{}, errors.New("loadtest.parseProcStat: no command name")
	}
	// After ')': state (field 3), ppid (4), … utime (14), stime (15),
	// cutime (16), cstime (17).
	var v [5]int64
	rest := b[i+1:]
	field, k := 3, 0
	for k < len(v) {
		for len(rest) > 0 && (rest[0] == ' ' || rest[0] == '\n') {
			rest = rest[1:]
		}
		if len(rest) == 0 {
			return procStat{}, fmt.Errorf("loadtest.parseProcStat: %d fields, want at least 17", field-1)
		}
		j := 0
		for j < len(rest) && rest[j] != ' ' && rest[j] != '\n' {
			j++
		}
		tok := rest[:j]
		rest = rest[j:]
		if field == 4 || (field >= 14 && field <= 17) {
			n, ok := parseTicks(tok, field == 4)
			if !ok {
				return procStat{}, fmt.Errorf("loadtest.parseProcStat: field %d: %q is not a count", field, tok)
			}
			v[k] = n
			k++
		}
		field++
	}
	return procStat{PPID: int(v[0]), Self: v[1] + v[2], Children: v[3] + v[4]}, nil
}

// parseTicks parses a decimal count (negative only when signed) of at
// most 18 digits.
func parseTicks(b []byte, signed bool) (int64, bool) {
	neg := false
	if signed && len(b) > 0 && b[0] == '-' {
		neg, b = true, b[1:]
	}
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}

// clockTicks is the kernel's clock tick rate (AT_CLKTCK of the auxiliary
// vector, what sysconf(_SC_CLK_TCK) returns); 100, Linux's USER_HZ, when
// it cannot be read.
func clockTicks() int64 {
	b, err := os.ReadFile("/proc/self/auxv")
	if err != nil {
		return 100
	}
	const atClkTck = 17
	for i := 0; i+16 <= len(b); i += 16 {
		k, v := binary.NativeEndian.Uint64(b[i:]), binary.NativeEndian.Uint64(b[i+8:])
		if k == 0 {
			break
		}
		if k == atClkTck && v > 0 && v < 1<<20 {
			return int64(v)
		}
	}
	return 100
}

// procTable reads /proc/<pid>/stat of every process (processes that end
// while it reads are skipped).
func procTable(proc string) (map[int]procStat, error) {
	d, err := os.Open(proc)
	if err != nil {
		return nil, fmt.Errorf("loadtest.procTable: %w", err)
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return nil, fmt.Errorf("loadtest.procTable: %w", err)
	}
	out := make(map[int]procStat, len(names))
	buf := make([]byte, 4096)
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil || pid <= 0 {
			continue
		}
		n, err := readInto(proc+"/"+name+"/stat", buf)
		if err != nil {
			continue
		}
		if st, err := parseProcStat(buf[:n]); err == nil {
			out[pid] = st
		}
	}
	return out, nil
}

// readInto reads a small file into buf (a stat line is well under 1 KiB).
func readInto(path string, buf []byte) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n, err := io.ReadFull(f, buf)
	if err == io.ErrUnexpectedEOF || err == io.EOF {
		err = nil
	}
	return n, err
}

// treeTicks is the CPU of root and of its live descendants (each with
// what it reaped), leaving out the subtrees of the pids in skip: those are
// named processes counted under their own role. ok is false when root is
// not in the table.
func treeTicks(tab map[int]procStat, kids map[int][]int, root int, skip map[int]bool) (ticks int64, ok bool) {
	if _, ok := tab[root]; !ok {
		return 0, false
	}
	stack := []int{root}
	seen := map[int]bool{}
	for len(stack) > 0 {
		p := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[p] {
			continue
		}
		seen[p] = true
		st := tab[p]
		ticks += st.Self + st.Children
		for _, c := range kids[p] {
			if !skip[c] {
				stack = append(stack, c)
			}
		}
	}
	return ticks, true
}

// childrenOf indexes the table by parent pid.
func childrenOf(tab map[int]procStat) map[int][]int {
	kids := make(map[int][]int, len(tab))
	for pid, st := range tab {
		kids[st.PPID] = append(kids[st.PPID], pid)
	}
	return kids
}

// ParseServerPIDs parses the --server-pids list: comma-separated
// role=pid pairs ("gateway=812,gateway=815,redis=640"); a role may name
// several processes, whose CPU is summed under it. Roles are lower-case
// letters, digits, '-' and '_'; the load tool's own role is reserved.
func ParseServerPIDs(s string) (map[string][]int, error) {
	out := map[string][]int{}
	seen := map[int]string{}
	err := forEachPair(s, "role=pid", func(part, role, p string) error {
		if role == RoleLoad {
			return fmt.Errorf("role %q is the load tool's own", role)
		}
		pid, err := strconv.Atoi(p)
		if err != nil || pid <= 0 || pid > 1<<22 {
			return fmt.Errorf("%q: pid %q is not a process id", part, p)
		}
		if r, dup := seen[pid]; dup {
			return fmt.Errorf("pid %d named twice (%s, %s)", pid, r, role)
		}
		seen[pid] = role
		out[role] = append(out[role], pid)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("loadtest.ParseServerPIDs: %w", err)
	}
	return out, nil
}

// forEachPair calls fn for each name=value of a comma-separated list
// (blank entries skipped) whose name is 1–32 of a-z, 0-9, - and _ (it may
// become a file name); want names the form in errors.
func forEachPair(s, want string, fn func(part, name, value string) error) error {
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, value, ok := strings.Cut(part, "=")
		if !ok {
			return fmt.Errorf("%q: want %s", part, want)
		}
		if name == "" || len(name) > 32 || strings.Trim(name, "abcdefghijklmnopqrstuvwxyz0123456789-_") != "" {
			return fmt.Errorf("name %q: want 1–32 of a-z, 0-9, - and _", name)
		}
		if err := fn(part, name, value); err != nil {
			return err
		}
	}
	return nil
}

// cpuSnapshot is the ticks of every named process at one instant.
type cpuSnapshot struct {
	at    time.Time
	ticks map[int]int64 // pid → ticks; absent: the process was not found
}

// cpuSampler takes the snapshots of a run: one at its start, one at the
// opening and every cpuSampleEvery from then until stopped, and one at
// the end.
type cpuSampler struct {
	proc  string
	self  int
	roles map[string][]int // RoleLoad included
	skip  map[int]bool

	mu    sync.Mutex
	snaps []cpuSnapshot
	err   string
}

func newCPUSampler(proc string, self int, servers map[string][]int) *cpuSampler {
	s := &cpuSampler{proc: proc, self: self, roles: map[string][]int{RoleLoad: {self}}, skip: map[int]bool{self: true}}
	for r, pids := range servers {
		for _, p := range pids {
			s.skip[p] = true
		}
		s.roles[r] = append(s.roles[r], pids...)
	}
	return s
}

// snap takes one snapshot now.
func (s *cpuSampler) snap(now time.Time) {
	tab, err := procTable(s.proc)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.err = err.Error()
		return
	}
	sn := cpuSnapshot{at: now, ticks: map[int]int64{}}
	kids := childrenOf(tab)
	for _, pids := range s.roles {
		for _, p := range pids {
			if t, ok := treeTicks(tab, kids, p, s.skip); ok {
				sn.ticks[p] = t
			}
		}
	}
	s.snaps = append(s.snaps, sn)
}

// run snapshots every cpuSampleBefore until the opening, at opensAt and
// every cpuSampleEvery after it until ctx ends.
func (s *cpuSampler) run(ctx context.Context, opensAt time.Time) {
	for {
		d := time.Until(opensAt)
		if d <= cpuSampleBefore {
			if !sleepCtx(ctx, d) {
				return
			}
			break
		}
		if !sleepCtx(ctx, cpuSampleBefore) {
			return
		}
		s.snap(time.Now())
	}
	t := time.NewTicker(cpuSampleEvery)
	defer t.Stop()
	for {
		s.snap(time.Now())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// CPUReport is the CPU the run cost, in CPU-seconds (utime + stime from
// /proc, children reaped included), over the window from the opening to
// the first snapshot at or after the last reservation, and over the whole
// run (its start to its end).
type CPUReport struct {
	ClockTicks   int64 `json:"clockTicksPerSecond"`
	ResolutionMs int64 `json:"resolutionMs"` // snapshot interval during the drop
	// Relative to the opening: the snapshots that bound the window, and
	// the last reservation they were chosen for (LastReservationFrom:
	// "orders.created_at" when PostgreSQL was read, else "client 202").
	WindowStartMs       int64  `json:"windowStartMs"`
	WindowEndMs         int64  `json:"windowEndMs"`
	LastReservationMs   int64  `json:"lastReservationMs"`
	LastReservationFrom string `json:"lastReservationFrom"`
	TotalMs             int64  `json:"totalMs"` // the whole run's snapshots apart

	// Roles: each server role and "load" (the tool and its workers).
	Roles map[string]CPURole `json:"roles"`
	// Server is every role but load; All adds load.
	Server CPUSeconds `json:"server"`
	Load   CPUSeconds `json:"load"`
	All    CPUSeconds `json:"all"`
	// Per 1,000 shoppers of the run and per 1,000 units sold.
	Shoppers            int      `json:"shoppers"`
	UnitsSold           int64    `json:"unitsSold"`
	PerThousandShoppers *CPUSums `json:"perThousandShoppers,omitempty"`
	PerThousandUnits    *CPUSums `json:"perThousandUnits,omitempty"`
	// Joins is the shoppers' arrival, when every join came before the
	// opening.
	Joins *CPUJoins `json:"joins,omitempty"`
	// Missing names processes not found in a snapshot: their figure is
	// left out of the sums.
	Missing []string `json:"missing,omitempty"`
	Error   string   `json:"error,omitempty"`
}

// CPUSeconds is one figure over the window and over the whole run.
type CPUSeconds struct {
	Window float64 `json:"windowSeconds"`
	Total  float64 `json:"totalSeconds"`
}

// CPURole is one role's processes and their summed CPU.
type CPURole struct {
	PIDs []int `json:"pids"`
	CPUSeconds
	// Processes: each process's own figure (with its children), so that
	// one busy gateway among idle ones shows.
	Processes []CPUProcess `json:"processes"`
}

// CPUProcess is one named process's CPU.
type CPUProcess struct {
	PID int `json:"pid"`
	CPUSeconds
}

// CPUJoins is the CPU from the run's start to the first snapshot at or
// after the last join (1 s snapshots before the opening): what the
// shoppers' arrival cost, every join's upgrade, token check and queue
// entry, with the waiting of those already in and the sale's creation.
type CPUJoins struct {
	LastJoinMs int64              `json:"lastJoinMs"` // from the run's start: the end of the last 100 ms slot with a join
	EndMs      int64              `json:"endMs"`      // the snapshot that ends the window, from the run's start
	Joined     int64              `json:"joined"`
	Roles      map[string]float64 `json:"roles"` // CPU-seconds by role, load included
	Server     float64            `json:"serverSeconds"`
	Load       float64            `json:"loadSeconds"`
	// ServerPerJoinUs is Server ÷ Joined, in µs.
	ServerPerJoinUs float64 `json:"serverPerJoinUs"`
}

// CPUSums are the three sums.
type CPUSums struct {
	Server CPUSeconds `json:"server"`
	Load   CPUSeconds `json:"load"`
	All    CPUSeconds `json:"all"`
}

// report computes the figures from the snapshots. opensAt is the opening,
// lastMs the last reservation relative to it (-1: none), hz the tick rate;
// lastJoinMs is the last join relative to the first snapshot (-1: none),
// joined the joins.
func (s *cpuSampler) report(opensAt time.Time, lastMs int64, from string, shoppers int, units int64, hz int64, lastJoinMs, joined int64) *CPUReport {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := &CPUReport{ClockTicks: hz, ResolutionMs: cpuSampleEvery.Milliseconds(), LastReservationMs: lastMs,
		LastReservationFrom: from, Roles: map[string]CPURole{}, Shoppers: shoppers, UnitsSold: units,
		WindowStartMs: -1, WindowEndMs: -1, Error: s.err}
	snaps := append([]cpuSnapshot(nil), s.snaps...)
	sort.SliceStable(snaps, func(i, j int) bool { return snaps[i].at.Before(snaps[j].at) })
	if len(snaps) < 2 {
		if r.Error == "" {
			r.Error = "fewer than two /proc snapshots"
		}
		return r
	}
	first, last := snaps[0], snaps[len(snaps)-1]
	r.TotalMs = last.at.Sub(first.at).Milliseconds()
	// The window: the first snapshot at or after the opening, to the first
	// at or after the last reservation (the last snapshot when none is).
	var ws, we *cpuSnapshot
	if lastMs >= 0 {
		end := opensAt.Add(time.Duration(lastMs) * time.Millisecond)
		wsAt := -1
		for i := range snaps {
			if ws == nil && !snaps[i].at.Before(opensAt) {
				ws, wsAt = &snaps[i], i
			}
			if we == nil && !snaps[i].at.Before(end) {
				we = &snaps[i]
			}
		}
		if ws != nil && we == nil {
			we = &last
		}
		if ws != nil && we == ws {
			// The last reservation came before the opening's snapshot was
			// taken (a sampler woken late): the window ends at the next
			// snapshot, one interval on.
			we = nil
			if wsAt+1 < len(snaps) {
				we = &snaps[wsAt+1]
			}
		}
		if ws != nil && we != nil {
			r.WindowStartMs, r.WindowEndMs = ws.at.Sub(opensAt).Milliseconds(), we.at.Sub(opensAt).Milliseconds()
		}
	}
	sec := func(t int64) float64 { return float64(t) / float64(hz) }
	roles := make([]string, 0, len(s.roles))
	for role := range s.roles {
		roles = append(roles, role)
	}
	sort.Strings(roles)
	for _, role := range roles {
		cr := CPURole{PIDs: append([]int(nil), s.roles[role]...)}
		for _, p := range cr.PIDs {
			a, okA := first.ticks[p]
			b, okB := last.ticks[p]
			if !okA || !okB {
				r.Missing = append(r.Missing, fmt.Sprintf("%s %d", role, p))
				continue
			}
			pc := CPUProcess{PID: p, CPUSeconds: CPUSeconds{Total: sec(b - a)}}
			if ws != nil && we != nil {
				a, okA := ws.ticks[p]
				b, okB := we.ticks[p]
				if okA && okB && b >= a {
					pc.Window = sec(b - a)
				}
			}
			cr.Total += pc.Total
			cr.Window += pc.Window
			cr.Processes = append(cr.Processes, pc)
		}
		r.Roles[role] = cr
		if role == RoleLoad {
			r.Load = cr.CPUSeconds
		} else {
			r.Server.Window += cr.Window
			r.Server.Total += cr.Total
		}
	}
	r.All = CPUSeconds{Window: r.Server.Window + r.Load.Window, Total: r.Server.Total + r.Load.Total}
	per := func(n float64) *CPUSums {
		if n <= 0 {
			return nil
		}
		f := 1000 / n
		sc := func(c CPUSeconds) CPUSeconds { return CPUSeconds{Window: c.Window * f, Total: c.Total * f} }
		return &CPUSums{Server: sc(r.Server), Load: sc(r.Load), All: sc(r.All)}
	}
	r.PerThousandShoppers = per(float64(shoppers))
	r.PerThousandUnits = per(float64(units))
	r.Joins = joinsWindow(snaps, s.roles, opensAt, lastJoinMs, joined, hz)
	return r
}

// joinsWindow is the CPU from the first snapshot to the first at or after
// the last join, when that one comes before the opening; nil otherwise.
func joinsWindow(snaps []cpuSnapshot, roles map[string][]int, opensAt time.Time, lastJoinMs, joined int64, hz int64) *CPUJoins {
	if lastJoinMs < 0 || joined <= 0 || len(snaps) < 2 {
		return nil
	}
	first := snaps[0]
	end := first.at.Add(time.Duration(lastJoinMs) * time.Millisecond)
	var we *cpuSnapshot
	for i := 1; i < len(snaps); i++ {
		if !snaps[i].at.Before(end) {
			we = &snaps[i]
			break
		}
	}
	if we == nil || we.at.After(opensAt) {
		return nil
	}
	j := &CPUJoins{LastJoinMs: lastJoinMs, EndMs: we.at.Sub(first.at).Milliseconds(), Joined: joined, Roles: map[string]float64{}}
	for role, pids := range roles {
		var t int64
		for _, p := range pids {
			a, okA := first.ticks[p]
			b, okB := we.ticks[p]
			if !okA || !okB || b < a {
				return nil // a process missing: no honest sum
			}
			t += b - a
		}
		sec := float64(t) / float64(hz)
		j.Roles[role] = sec
		if role == RoleLoad {
			j.Load += sec
		} else {
			j.Server += sec
		}
	}
	j.ServerPerJoinUs = j.Server * 1e6 / float64(joined)
	return j
}

// Text is the report's CPU section as a few lines of text.
func (r *CPUReport) Text() string {
	var b strings.Builder
	if r.Error != "" {
		fmt.Fprintf(&b, "cpu: %s\n", r.Error)
	}
	fmt.Fprintf(&b, "cpu-seconds (window: opening to the snapshot %d ms after it, at or after the last reservation %d ms from %s, %d ms snapshots; total: the whole run, %d ms)\n",
		r.WindowEndMs, r.LastReservationMs, r.LastReservationFrom, r.ResolutionMs, r.TotalMs)
	roles := make([]string, 0, len(r.Roles))
	for role := range r.Roles {
		roles = append(roles, role)
	}
	sort.Strings(roles)
	for _, role := range roles {
		c := r.Roles[role]
		var each []string
		if len(c.Processes) > 1 {
			for _, p := range c.Processes {
				each = append(each, fmt.Sprintf("%d %.2f/%.2f", p.PID, p.Window, p.Total))
			}
		}
		fmt.Fprintf(&b, "cpu %-12s window %7.2f s  total %7.2f s  (%d processes%s)\n", role, c.Window, c.Total, len(c.PIDs),
			strings.TrimSuffix(": "+strings.Join(each, ", "), ": "))
	}
	fmt.Fprintf(&b, "cpu server       window %7.2f s  total %7.2f s\n", r.Server.Window, r.Server.Total)
	fmt.Fprintf(&b, "cpu all          window %7.2f s  total %7.2f s\n", r.All.Window, r.All.Total)
	if p := r.PerThousandShoppers; p != nil {
		fmt.Fprintf(&b, "cpu per 1,000 shoppers (%d): server %.3f / %.3f s, load %.3f / %.3f s, all %.3f / %.3f s (window / total)\n",
			r.Shoppers, p.Server.Window, p.Server.Total, p.Load.Window, p.Load.Total, p.All.Window, p.All.Total)
	}
	if p := r.PerThousandUnits; p != nil {
		fmt.Fprintf(&b, "cpu per 1,000 units (%d sold): server %.3f / %.3f s, load %.3f / %.3f s, all %.3f / %.3f s (window / total)\n",
			r.UnitsSold, p.Server.Window, p.Server.Total, p.Load.Window, p.Load.Total, p.All.Window, p.All.Total)
	}
	if j := r.Joins; j != nil {
		var each []string
		for _, role := range roles {
			if role != RoleLoad {
				each = append(each, fmt.Sprintf("%s %.2f", role, j.Roles[role]))
			}
		}
		fmt.Fprintf(&b, "cpu joins: the run's start to the snapshot %d ms after it (last join %d ms): %d joined; server %.2f s (%s), %.0f us per join; load %.2f s\n",
			j.EndMs, j.LastJoinMs, j.Joined, j.Server, strings.Join(each, ", "), j.ServerPerJoinUs, j.Load)
	}
	if len(r.Missing) > 0 {
		fmt.Fprintf(&b, "cpu: not found in a snapshot, left out: %s\n", strings.Join(r.Missing, ", "))
	}
	return b.String()
}

// cpuReport computes the run's CPU section: the window ends at the last
// reservation in server time (orders.created_at) when PostgreSQL was read,
// else at the last 202 a client saw; units sold are the admin API's sold,
// else the run's 202s.
func (r *Report) cpuReport(s *cpuSampler, hz int64) *CPUReport {
	last, from := r.LastReservationMs, "client 202"
	if r.Persist != nil && r.Persist.LastCreatedMs >= 0 {
		last, from = r.Persist.LastCreatedMs, "orders.created_at"
	}
	units := r.Orders.Sold
	if units <= 0 {
		units = r.Orders.Reserved
	}
	return s.report(r.OpensAt, last, from, r.Shoppers, units, hz, r.lastJoinMs(), r.Counters.Joined)
}

// lastJoinMs is the end of the last timeseries slot in which a join
// ended (from the run's start), or -1.
func (r *Report) lastJoinMs() int64 {
	for i := len(r.Timeseries) - 1; i >= 0; i-- {
		for k, n := range r.Timeseries[i].Outcomes {
			if n > 0 && strings.HasPrefix(k, "join ") {
				return r.Timeseries[i].TMs + slotWidth.Milliseconds()
			}
		}
	}
	return -1
}

// ProcessCPU is the CPU time pid has used itself (utime + stime of
// /proc/<pid>/stat, its reaped children left out): what the HTTP
// benchmarks read of a server before and after a run to price a request.
func ProcessCPU(pid int) (time.Duration, error) {
	buf := make([]byte, 1024)
	n, err := readInto("/proc/"+strconv.Itoa(pid)+"/stat", buf)
	if err != nil {
		return 0, fmt.Errorf("loadtest.ProcessCPU: %w", err)
	}
	st, err := parseProcStat(buf[:n])
	if err != nil {
		return 0, err
	}
	return time.Duration(st.Self) * time.Second / time.Duration(clockTicks()), nil
}
