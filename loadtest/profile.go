package loadtest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// OpeningProfile asks for CPU profiles of the opening: of every server named
// in URLs (its admin listener's /debug/pprof/profile) and of each load
// worker process, from Before the opening for Seconds. Each lands in Dir as
// <name>.pprof (the load tool's own as loadtest.pprof, its workers' as
// loadtest-worker-<k>.pprof); a profile that
// could not be taken is a note in the report, never a failed run.
type OpeningProfile struct {
	Dir     string            `json:"dir,omitempty"`
	URLs    map[string]string `json:"urls,omitempty"` // name → admin base URL
	Before  time.Duration     `json:"before,omitempty"`
	Seconds int               `json:"seconds,omitempty"`
}

// Defaults of OpeningProfile.
const (
	DefaultProfileBefore  = 500 * time.Millisecond
	DefaultProfileSeconds = 3
)

func (p OpeningProfile) on() bool { return p.Dir != "" }

func (p OpeningProfile) withDefaults() OpeningProfile {
	if p.Before <= 0 {
		p.Before = DefaultProfileBefore
	}
	if p.Seconds <= 0 {
		p.Seconds = DefaultProfileSeconds
	}
	return p
}

// ParseProfileURLs reads name=url,… (gateway1=http://127.0.0.1:19081): a
// name becomes a file name, so it is 1–32 of a-z, 0-9, - and _.
func ParseProfileURLs(s string) (map[string]string, error) {
	out := map[string]string{}
	err := forEachPair(s, "name=url", func(part, name, u string) error {
		if _, dup := out[name]; dup {
			return fmt.Errorf("name %q given twice", name)
		}
		pu, err := url.Parse(u)
		if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			return fmt.Errorf("%q: want an http(s) URL", part)
		}
		out[name] = strings.TrimRight(u, "/")
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("loadtest.ParseProfileURLs: %w", err)
	}
	return out, nil
}

// profileServers fetches every server's profile of the opening into
// p.Dir, waiting until p.Before the opening to ask; it returns one note per
// profile it could not take.
func profileServers(ctx context.Context, p OpeningProfile, opensAt time.Time) []string {
	p = p.withDefaults()
	if len(p.URLs) == 0 {
		return nil
	}
	if !sleepCtx(ctx, time.Until(opensAt.Add(-p.Before))) {
		return []string{"opening profiles: the run ended before the opening"}
	}
	hc := &http.Client{Timeout: time.Duration(p.Seconds)*time.Second + 30*time.Second}
	var mu sync.Mutex
	var notes []string
	var wg sync.WaitGroup
	for name, base := range p.URLs {
		wg.Go(func() {
			if err := fetchProfile(ctx, hc, base, p.Seconds, filepath.Join(p.Dir, name+".pprof")); err != nil {
				mu.Lock()
				notes = append(notes, fmt.Sprintf("opening profile of %s: %v", name, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return notes
}

func fetchProfile(ctx context.Context, hc *http.Client, base string, seconds int, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/debug/pprof/profile?seconds="+strconv.Itoa(seconds), nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// profileOpening profiles this process into p.Dir/name.pprof from
// p.Before the opening for p.Seconds, in the background; wait returns once
// the profile is written or abandoned (ctx ended first).
func profileOpening(ctx context.Context, p OpeningProfile, name string, opensAt time.Time) (wait func() error) {
	p = p.withDefaults()
	done := make(chan error, 1)
	go func() {
		if !sleepCtx(ctx, time.Until(opensAt.Add(-p.Before))) {
			done <- nil
			return
		}
		stop, err := startCPUProfile(filepath.Join(p.Dir, name+".pprof"))
		if err != nil {
			done <- err
			return
		}
		sleepCtx(ctx, time.Duration(p.Seconds)*time.Second)
		stop()
		done <- nil
	}()
	return func() error { return <-done }
}
