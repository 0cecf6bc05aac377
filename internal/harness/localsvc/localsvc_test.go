package localsvc

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStartPostgresPortTaken: a port given by the caller and already taken
// fails with PostgreSQL's own reason from server.log; the same start with
// a port of its choosing succeeds.
func TestStartPostgresPortTaken(t *testing.T) {
	if _, err := findPostgresBin(); errors.Is(err, ErrMissing) {
		t.Skip(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "pg")
	taken := ln.Addr().(*net.TCPAddr).Port
	if p, err := StartPostgres(ctx, PostgresOptions{Dir: dir, Port: taken, Fast: true}); err == nil {
		_ = p.Stop()
		t.Fatalf("started on taken port %d", taken)
	} else if !strings.Contains(err.Error(), "server.log") || !strings.Contains(err.Error(), "could not") {
		t.Errorf("error without PostgreSQL's reason: %v", err)
	}
	p, err := StartPostgres(ctx, PostgresOptions{Dir: dir, Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	if p.Port == taken {
		t.Errorf("picked the taken port %d", taken)
	}
	if err := p.Stop(); err != nil {
		t.Error(err)
	}
}
