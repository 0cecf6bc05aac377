package loadtest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/pprof"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseProfileURLs(t *testing.T) {
	got, err := ParseProfileURLs(" dev=http://127.0.0.1:19080, gateway1=https://10.0.0.1:9090/,")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["dev"] != "http://127.0.0.1:19080" || got["gateway1"] != "https://10.0.0.1:9090" {
		t.Fatalf("ParseProfileURLs = %v", got)
	}
	if got, err := ParseProfileURLs(""); err != nil || len(got) != 0 {
		t.Fatalf(`ParseProfileURLs("") = %v, %v; want none`, got, err)
	}
	for _, bad := range []string{"dev", "=http://a", "Dev=http://a", "a b=http://a", "../x=http://a",
		"a=ftp://h", "a=http://", "a=:", "a=http://h,a=http://h"} {
		if got, err := ParseProfileURLs(bad); err == nil {
			t.Errorf("ParseProfileURLs(%q) = %v, want an error", bad, got)
		}
	}
}

func FuzzParseProfileURLs(f *testing.F) {
	f.Add("dev=http://127.0.0.1:19080,gateway1=http://127.0.0.1:19081")
	f.Add("a=http://h,a=http://h")
	f.Add("../../etc=http://h")
	f.Add(",,=")
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseProfileURLs(s)
		if err != nil {
			return
		}
		for name, u := range m {
			// A name is a file name in the profile directory: never a path.
			if name == "" || strings.ContainsAny(name, "/\\.") {
				t.Fatalf("ParseProfileURLs(%q): name %q accepted", s, name)
			}
			if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
				t.Fatalf("ParseProfileURLs(%q): URL %q accepted", s, u)
			}
		}
	})
}

// TestProfileServers: from Before the opening each named server's CPU
// profile is fetched into the directory; one that answers an error
// becomes a note, and the others are still written.
func TestProfileServers(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	good := httptest.NewServer(mux)
	defer good.Close()
	bad := httptest.NewServer(http.NotFoundHandler())
	defer bad.Close()
	dir := t.TempDir()
	p := OpeningProfile{Dir: dir, URLs: map[string]string{"good": good.URL, "bad": bad.URL}, Before: 200 * time.Millisecond, Seconds: 1}
	opens := time.Now().Add(300 * time.Millisecond)
	notes := profileServers(context.Background(), p, opens)
	if len(notes) != 1 || !strings.Contains(notes[0], "bad") {
		t.Errorf("notes %q, want one for the server that failed", notes)
	}
	fi, err := os.Stat(filepath.Join(dir, "good.pprof"))
	if err != nil || fi.Size() == 0 {
		t.Fatalf("good.pprof: %v, %v; want a profile", fi, err)
	}
	// The profile covers the opening: it was asked for no earlier than
	// Before the opening.
	if fi.ModTime().Before(opens.Add(-p.Before)) {
		t.Errorf("profile written %v, before its window began at %v", fi.ModTime(), opens.Add(-p.Before))
	}
	if _, err := os.Stat(filepath.Join(dir, "bad.pprof")); err == nil {
		t.Error("bad.pprof written for a server that answered 404")
	}
}
