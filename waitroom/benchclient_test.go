package waitroom

// The WebSocket clients of BenchmarkConnections run in child processes (the
// test binary re-executed with benchClientEnv set), so that the benchmark
// process holds only the server side of every connection: its memory per
// connection is the gateway's, and its 20,000 open files (the hard limit on
// these machines, DESIGN.md) go to server sockets only.
//
// A child is intercepted in init, before TestMain, so it does not start the
// package's Redis and PostgreSQL (testenv.Main) and its stdout carries only
// the protocol below.
//
// Protocol, one line each:
//
//	child → parent  "joined N"   all N connections joined and read their first status
//	child → parent  "got K"      every connection read its (K+1)-th status (K = push round, from 1)
//	child → parent  "error ..."  a dial, join or read failed; the child exits 1
//	parent → child  EOF on stdin: close every connection and exit 0
//
// The parent times a push from its trigger until it has "got K" from every
// child (a pipe write and read add a few µs to the 100+ ms measured).

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/flashsale/flashsale/auth"
)

const (
	benchClientEnv   = "FLASHSALE_BENCH_CLIENT" // "addr sale firstUser count octet clockMs"
	maxConnsPerChild = 9500                     // ≤ 20,000 open files per process, with room to spare
	connsPerSource   = 250                      // client sockets per 127.x.y.z source address
	childDialers     = 64                       // dials in flight per child
	childLifetime    = 30 * time.Minute         // a child never outlives this
)

func init() {
	spec := os.Getenv(benchClientEnv)
	if spec == "" {
		return
	}
	if err := runBenchClient(spec, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stdout, "error %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// raiseNoFile sets the soft open-files limit to the hard limit.
func raiseNoFile() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return 0, err
		}
	}
	return lim.Cur, nil
}

// procStatusKB reads a "Name:   N kB" field of /proc/self/status.
func procStatusKB(field string) (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			return strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
		}
	}
	return 0, fmt.Errorf("%s not in /proc/self/status", field)
}

// rawClient is a minimal WebSocket client on a bare TCP connection.
type rawClient struct {
	nc net.Conn
	br *bufio.Reader
}

// dialRaw opens a WebSocket to the sale's queue from local and sends the join.
func dialRaw(addr string, local net.IP, saleID int64, token string) (*rawClient, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: local}, Timeout: 10 * time.Second}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	_ = nc.SetDeadline(time.Now().Add(30 * time.Second))
	req := "GET " + SalePath + strconv.FormatInt(saleID, 10) + "/queue HTTP/1.1\r\nHost: " + addr +
		"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
	if _, err := io.WriteString(nc, req); err != nil {
		nc.Close()
		return nil, err
	}
	c := &rawClient{nc: nc, br: bufio.NewReaderSize(nc, 256)}
	status, err := c.br.ReadString('\n')
	if err != nil {
		nc.Close()
		return nil, err
	}
	if !strings.HasPrefix(status, "HTTP/1.1 101") {
		nc.Close()
		return nil, fmt.Errorf("upgrade refused: %q", strings.TrimSpace(status))
	}
	for {
		line, err := c.br.ReadString('\n')
		if err != nil {
			nc.Close()
			return nil, err
		}
		if line == "\r\n" {
			break
		}
	}
	join, _ := json.Marshal(map[string]string{"type": "join", "accessToken": token})
	if err := c.write(0x1, join); err != nil {
		nc.Close()
		return nil, err
	}
	_ = nc.SetDeadline(time.Time{})
	return c, nil
}

// write sends one masked frame (zero mask key: the payload goes unchanged).
func (c *rawClient) write(opcode byte, p []byte) error {
	var frame []byte
	if len(p) < 126 {
		frame = []byte{0x80 | opcode, 0x80 | byte(len(p)), 0, 0, 0, 0}
	} else {
		frame = []byte{0x80 | opcode, 0x80 | 126, 0, 0, 0, 0, 0, 0}
		binary.BigEndian.PutUint16(frame[2:], uint16(len(p)))
	}
	_, err := c.nc.Write(append(frame, p...))
	return err
}

// nextText reads frames until a text frame and returns its payload;
// it answers pings (the room pings a slice of its connections every tick).
func (c *rawClient) nextText() ([]byte, error) {
	for {
		var h [2]byte
		if _, err := io.ReadFull(c.br, h[:]); err != nil {
			return nil, err
		}
		n := int(h[1] & 0x7f)
		switch n {
		case 126:
			var ext [2]byte
			if _, err := io.ReadFull(c.br, ext[:]); err != nil {
				return nil, err
			}
			n = int(binary.BigEndian.Uint16(ext[:]))
		case 127:
			return nil, errors.New("frame too large")
		}
		p := make([]byte, n)
		if _, err := io.ReadFull(c.br, p); err != nil {
			return nil, err
		}
		switch op := h[0] & 0x0f; op {
		case 0x1:
			return p, nil
		case 0x9:
			if err := c.write(0xA, p); err != nil {
				return nil, err
			}
		case 0x8:
			return nil, fmt.Errorf("server closed: %q", p)
		}
	}
}

// runBenchClient is a child's main: open the connections, report, count.
func runBenchClient(spec string, stdin io.Reader, stdout io.Writer) error {
	var addr string
	var saleID, first, clockMs int64
	var count, octet int
	if _, err := fmt.Sscan(spec, &addr, &saleID, &first, &count, &octet, &clockMs); err != nil {
		return fmt.Errorf("bad %s %q: %v", benchClientEnv, spec, err)
	}
	if _, err := raiseNoFile(); err != nil {
		return err
	}
	debug.SetGCPercent(400) // the clients' memory is not what is measured
	var outMu sync.Mutex
	say := func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(stdout, format+"\n", args...)
	}
	now := time.UnixMilli(clockMs)
	var (
		mu      sync.Mutex
		perRnd  = map[int]int{} // frames read per status number
		stop    atomic.Bool
		failed  = make(chan error, 1)
		joined  = make(chan struct{})
		clients = make([]*rawClient, count)
	)
	fail := func(err error) {
		select {
		case failed <- err:
		default:
		}
	}
	// record counts the k-th status of one connection (k = 1 is the join's).
	record := func(k int) {
		mu.Lock()
		perRnd[k]++
		full := perRnd[k] == count
		if full {
			delete(perRnd, k)
		}
		mu.Unlock()
		if !full {
			return
		}
		if k == 1 {
			close(joined)
		} else {
			say("got %d", k-1)
		}
	}
	read := func(i int, c *rawClient) {
		for k := 1; ; k++ {
			if _, err := c.nextText(); err != nil {
				if !stop.Load() {
					fail(fmt.Errorf("connection %d, status %d: %v", i, k, err))
				}
				return
			}
			record(k)
		}
	}
	// Dial with a bounded pool; each connection then gets a reader.
	var next atomic.Int64
	var wg sync.WaitGroup
	for range childDialers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= count || len(failed) > 0 {
					return
				}
				tok, err := auth.Mint(jwtSecret, first+int64(i), false, time.Hour, now)
				if err != nil {
					fail(err)
					return
				}
				local := net.IPv4(127, byte(octet), byte(i/connsPerSource/250), byte(1+i/connsPerSource%250))
				c, err := dialRaw(addr, local, saleID, tok)
				if err != nil {
					fail(fmt.Errorf("connection %d from %v: %v", i, local, err))
					return
				}
				clients[i] = c
				go read(i, c)
			}
		})
	}
	wg.Wait()
	closeAll := func() {
		stop.Store(true)
		for _, c := range clients {
			if c != nil {
				c.nc.Close()
			}
		}
	}
	defer closeAll()
	select {
	case err := <-failed:
		return err
	case <-joined:
	case <-time.After(5 * time.Minute):
		return errors.New("timed out waiting for the first statuses")
	}
	say("joined %d", count)
	eof := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, stdin); close(eof) }()
	select {
	case err := <-failed:
		return err
	case <-eof:
		return nil
	case <-time.After(childLifetime):
		return errors.New("child lifetime exceeded")
	}
}

// benchChild is one client process, seen from the benchmark.
type benchChild struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr bytes.Buffer
	n      int
}

type childLine struct {
	child int
	line  string
}

// clientFleet is the set of client processes of one benchmark.
type clientFleet struct {
	children []*benchChild
	lines    chan childLine
}

// startClients starts ceil(n/maxConnsPerChild) (at least 2) client processes
// opening n connections in all to addr, users from 1, and waits until
// every connection has read its first status.
func startClients(tb testing.TB, addr string, saleID int64, n int, clockMs int64) *clientFleet {
	tb.Helper()
	k := max(2, (n+maxConnsPerChild-1)/maxConnsPerChild)
	f := &clientFleet{lines: make(chan childLine, 1024)}
	tb.Cleanup(f.stop)
	first := int64(1)
	for i := range k {
		cnt := n / k
		if i < n%k {
			cnt++
		}
		ch := &benchChild{n: cnt}
		ch.cmd = exec.Command(os.Args[0], "-test.run=^$")
		ch.cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %d %d %d %d", benchClientEnv, addr, saleID, first, cnt, 1+i, clockMs),
			"GOMAXPROCS="+strconv.Itoa(runtime.NumCPU()))
		ch.cmd.Stderr = &ch.stderr
		stdout, err := ch.cmd.StdoutPipe()
		if err != nil {
			tb.Fatal(err)
		}
		if ch.stdin, err = ch.cmd.StdinPipe(); err != nil {
			tb.Fatal(err)
		}
		if err := ch.cmd.Start(); err != nil {
			tb.Fatal(err)
		}
		f.children = append(f.children, ch)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				f.lines <- childLine{i, sc.Text()}
			}
			f.lines <- childLine{i, "exit"}
		}()
		first += int64(cnt)
	}
	for range f.children {
		l := f.wait(tb, 5*time.Minute)
		if !strings.HasPrefix(l.line, "joined ") {
			tb.Fatalf("client %d: %s", l.child, l.line)
		}
	}
	return f
}

// wait returns the next line of any child, failing on "error" and "exit".
func (f *clientFleet) wait(tb testing.TB, timeout time.Duration) childLine {
	tb.Helper()
	select {
	case l := <-f.lines:
		if strings.HasPrefix(l.line, "error") || l.line == "exit" {
			tb.Fatalf("client process %d: %s\nstderr: %s", l.child, l.line, f.children[l.child].stderr.String())
		}
		return l
	case <-time.After(timeout):
		tb.Fatalf("no word from the client processes in %v", timeout)
		return childLine{}
	}
}

// waitRound waits until every child has "got round".
func (f *clientFleet) waitRound(tb testing.TB, round int) {
	tb.Helper()
	want := "got " + strconv.Itoa(round)
	for range f.children {
		if l := f.wait(tb, time.Minute); l.line != want {
			tb.Fatalf("client process %d: %q, want %q", l.child, l.line, want)
		}
	}
}

// stop closes the children's stdin (they close their connections and
// exit) and reaps them; one that has not exited in 30 s is killed.
func (f *clientFleet) stop() {
	for _, ch := range f.children {
		_ = ch.stdin.Close()
	}
	for _, ch := range f.children {
		done := make(chan struct{})
		go func() { _ = ch.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = ch.cmd.Process.Kill()
			<-done
		}
	}
	f.children = nil
}

// selfCPU is this process's CPU time so far (user + system).
func selfCPU(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpu is the client processes' CPU time so far (user + system, from
// /proc/PID/stat in clock ticks of 10 ms).
func (f *clientFleet) cpu(tb testing.TB) time.Duration {
	tb.Helper()
	var sum time.Duration
	for _, ch := range f.children {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", ch.cmd.Process.Pid))
		if err != nil {
			tb.Fatal(err)
		}
		i := bytes.LastIndexByte(b, ')')
		fields := strings.Fields(string(b[i+1:])) // state is fields[0]; utime, stime are fields[11], [12]
		if len(fields) < 13 {
			tb.Fatalf("short /proc/%d/stat", ch.cmd.Process.Pid)
		}
		for _, s := range fields[11:13] {
			v, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				tb.Fatal(err)
			}
			sum += time.Duration(v) * 10 * time.Millisecond
		}
	}
	return sum
}

// serverMem is the benchmark process's memory after a GC (and returning
// free pages to the OS, so that RSS is what the process holds).
type serverMem struct {
	heapInuse, heapAlloc, stack uint64
	rssKB, hwmKB                int64
}

func readServerMem(tb testing.TB) serverMem {
	tb.Helper()
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rss, err := procStatusKB("VmRSS")
	if err != nil {
		tb.Fatal(err)
	}
	hwm, err := procStatusKB("VmHWM")
	if err != nil {
		tb.Fatal(err)
	}
	return serverMem{heapInuse: ms.HeapInuse, heapAlloc: ms.HeapAlloc, stack: ms.StackInuse, rssKB: rss, hwmKB: hwm}
}

// TestConnectionsChildProcesses is the quick path of BenchmarkConnections:
// 200 connections held by two client processes get two pushes.
func TestConnectionsChildProcesses(t *testing.T) {
	h := startConnBench(t, 200)
	for round := 1; round <= 2; round++ {
		h.push(t, round)
	}
}
