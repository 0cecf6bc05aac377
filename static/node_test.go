package static

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// node returns the path of node, skipping the test when it is absent.
func node(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not on PATH")
	}
	return p
}

func runNode(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node(t), args...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("node %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

// TestJavaScriptParses runs node --check on every embedded script (as ES
// modules: package.json in this directory says "type": "module").
func TestJavaScriptParses(t *testing.T) {
	node(t)
	files, err := filepath.Glob("site/assets/*.js")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts found: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			runNode(t, "--check", f)
		})
	}
}

// TestJavaScriptUnits runs the node:test suites of the pure modules: server
// clock, backoff, proof of work, token handling, queue client, charts,
// the description of a change (conflict.js), the turn notification's
// subscribe (notify.js).
func TestJavaScriptUnits(t *testing.T) {
	node(t)
	files, err := filepath.Glob("testdata/js/*.test.js")
	if err != nil || len(files) == 0 {
		t.Fatalf("no node tests found: %v", err)
	}
	out := runNode(t, append([]string{"--test"}, files...)...)
	if !strings.Contains(out, "# fail 0") {
		t.Fatalf("node tests failed:\n%s", out)
	}
}

// TestPowSolverAgreesWithGo solves a challenge with the page's solver and
// checks in Go that the nonce is accepted and is the smallest one.
func TestPowSolverAgreesWithGo(t *testing.T) {
	node(t)
	salt := "9f86d081884c7d659a2feaa0c55ad015"
	// floor(2^256 / 8192): difficulty 8192, as defense/POW.md defines it.
	threshold := "0008000000000000000000000000000000000000000000000000000000000000"
	script := `import { solve } from './site/assets/pow.js';
console.log(solve({ type: 'challenge', algorithm: 'SHA-256', salt: '` + salt + `', difficulty: 8192, threshold: '` + threshold + `' }));`
	out := runNode(t, "--input-type=module", "-e", script)
	nonce, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("solver printed %q", out)
	}
	// POW.md: the hashed input is the salt text followed by the decimal nonce.
	accepted := func(n int) bool {
		sum := sha256.Sum256([]byte(salt + strconv.Itoa(n)))
		return hex.EncodeToString(sum[:]) < threshold
	}
	if !accepted(nonce) {
		t.Fatalf("nonce %d is not accepted", nonce)
	}
	for n := range nonce {
		if accepted(n) {
			t.Fatalf("nonce %d accepted but %d is smaller and accepted too", nonce, n)
		}
	}
}
