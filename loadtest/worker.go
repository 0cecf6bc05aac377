package loadtest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"sync"
	"time"
)

// workerLine is one line a worker writes to stdout.
type workerLine struct {
	Progress *Counters `json:"progress,omitempty"`
	Result   *partial  `json:"result,omitempty"`
	Error    string    `json:"error,omitempty"`
}

// RunWorker is the body of a forked worker process (started with WorkerArg): it
// reads its share of the shoppers as one JSON object from stdin, runs it,
// writes progress lines and finally its measurements as JSON lines to
// stdout. Closing its stdin (or ctx) ends the shoppers early; the result is
// still written.
func RunWorker(ctx context.Context) error {
	return runWorker(ctx, os.Stdin, os.Stdout)
}

func runWorker(ctx context.Context, in io.Reader, out io.Writer) error {
	dec := json.NewDecoder(in)
	var spec workSpec
	if err := dec.Decode(&spec); err != nil {
		return fmt.Errorf("loadtest worker: read work: %w", err)
	}
	cfg := spec.Config
	cfg.JWTSecret = spec.JWTSecret
	ctx, cancel := context.WithDeadline(ctx, spec.Deadline)
	defer cancel()
	go func() {
		// EOF on stdin: the coordinator wants us to stop.
		io.Copy(io.Discard, io.MultiReader(dec.Buffered(), in))
		cancel()
	}()

	var mu sync.Mutex
	enc := json.NewEncoder(out)
	emit := func(l workerLine) error {
		mu.Lock()
		defer mu.Unlock()
		return enc.Encode(l)
	}
	if dir := cfg.WorkerCPUProfileDir; dir != "" {
		stop, err := startCPUProfile(filepath.Join(dir, fmt.Sprintf("loadtest-worker-%d.pprof", os.Getpid())))
		if err != nil {
			return fmt.Errorf("loadtest worker: %w", err)
		}
		defer stop()
	} else if cfg.Profile.on() {
		// One CPU profile at a time: the whole run's, when asked, wins.
		wait := profileOpening(ctx, cfg.Profile, fmt.Sprintf("loadtest-worker-%d", spec.Worker), spec.Sale.OpensAt)
		defer func() {
			if err := wait(); err != nil {
				fmt.Fprintf(os.Stderr, "loadtest worker %d: opening profile: %v\n", spec.Worker, err)
			}
		}()
	}
	rec := newRecorder(spec.Epoch)
	cl := newClients(cfg.baseURLs(), cfg.SourceAddrs)
	defer cl.close()
	s := newShard(cfg, spec.Sale, rec, cl)

	pctx, pcancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-pctx.Done():
				return
			case <-t.C:
				c := rec.live.snapshot()
				if emit(workerLine{Progress: &c}) != nil {
					return
				}
			}
		}
	}()
	s.runShoppers(ctx, spec)
	pcancel()
	wg.Wait()
	return emit(workerLine{Result: rec.result()})
}

// startCPUProfile profiles this process into file until the returned stop.
func startCPUProfile(file string) (stop func(), err error) {
	f, err := os.Create(file)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// runWorkers forks n worker processes for spec's shoppers and merges their
// results into into. Cancelling ctx closes their stdin; a worker that does
// not finish 10 s later is killed.
func runWorkers(ctx context.Context, spec workSpec, n int, prog *progress, into *recorder) error {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for k := range n {
		sub := spec
		sub.First = spec.First + k*spec.Count/n
		sub.Count = spec.First + (k+1)*spec.Count/n - sub.First
		sub.Worker = k
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[k] = runOneWorker(ctx, exe, k, sub, prog, into)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func runOneWorker(ctx context.Context, exe string, k int, spec workSpec, prog *progress, into *recorder) error {
	cmd := exec.Command(exe, WorkerArg)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("loadtest: start worker %d: %w", k, err)
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-stop:
			return
		case <-ctx.Done():
		}
		stdin.Close()
		t := time.NewTimer(10 * time.Second)
		defer t.Stop()
		select {
		case <-stop:
		case <-t.C:
			cmd.Process.Kill()
		}
	}()
	b, err := json.Marshal(spec)
	if err == nil {
		_, err = stdin.Write(append(b, '\n'))
	}
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return fmt.Errorf("loadtest: worker %d: send work: %w", k, err)
	}
	var result *partial
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 512<<20)
	for sc.Scan() {
		var l workerLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			continue // not ours (a stray print)
		}
		switch {
		case l.Progress != nil && prog != nil:
			prog.setWorker(k, *l.Progress)
		case l.Result != nil:
			result = l.Result
		}
	}
	werr := cmd.Wait()
	if result == nil {
		return fmt.Errorf("loadtest: worker %d ended without a result: %v", k, werr)
	}
	if prog != nil {
		prog.setWorker(k, result.Count)
	}
	into.mergeRemote(result)
	return nil
}
