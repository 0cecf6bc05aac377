package defense

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/harness/testenv"
)

func TestStorePersistsAndAudits(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	s := NewStore(pool, testenv.Redis(t), nil)

	got, err := s.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultSettings()
	want.Preset = PresetNormal
	if !reflect.DeepEqual(got, want) {
		t.Errorf("empty store: got %+v, want the defaults", got)
	}

	st, err := ParseSettings([]byte(contractExample))
	if err != nil {
		t.Fatal(err)
	}
	st.RateLimit.PerPrefix = Limit{RPS: 100, Burst: 200}
	stored, err := s.Put(ctx, "1001", st)
	if err != nil {
		t.Fatal(err)
	}
	if stored.Version != 1 || stored.Preset != PresetCustom {
		t.Errorf("stored version %d preset %q, want 1 and custom", stored.Version, stored.Preset)
	}

	// Invalid settings and a missing actor change nothing.
	bad := st.clone()
	bad.RateLimit.PerUser.Burst = 0
	if _, err := s.Put(ctx, "1001", bad); flashsale.ErrorCode(err) != flashsale.CodeInvalid || !strings.Contains(flashsale.ErrorMessage(err), "rateLimit.perUser.burst") {
		t.Errorf("invalid Put: %v, want INVALID naming rateLimit.perUser.burst", err)
	}
	if _, err := s.Put(ctx, " ", st); flashsale.ErrorCode(err) != flashsale.CodeInvalid {
		t.Errorf("Put without actor: %v, want INVALID", err)
	}

	// A new Store (a restart) reads the same settings.
	again, err := NewStore(pool, nil, nil).Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(again, stored) {
		t.Errorf("after restart:\n got %+v\nwant %+v", again, stored)
	}
	if v, err := s.Version(ctx); err != nil || v != 1 {
		t.Errorf("Version = %d, %v; want 1", v, err)
	}

	// Presets switch the knobs and keep the blocklist.
	attack, err := s.ApplyPreset(ctx, "1002", PresetUnderAttack)
	if err != nil {
		t.Fatal(err)
	}
	p := Presets()[PresetUnderAttack]
	if attack.Preset != PresetUnderAttack || attack.Version != 2 || attack.knobs() != p.knobs() {
		t.Errorf("after preset: %+v, want the under-attack knobs at version 2", attack)
	}
	if !reflect.DeepEqual(attack.Blocklist, st.Blocklist) {
		t.Errorf("preset dropped the blocklist: %+v", attack.Blocklist)
	}
	if _, err := s.ApplyPreset(ctx, "1002", "panic"); flashsale.ErrorCode(err) != flashsale.CodeNotFound {
		t.Errorf("unknown preset: %v, want NOT_FOUND", err)
	}
	// Putting a preset's knobs by hand names the preset.
	drop := Presets()[PresetDrop]
	drop.Blocklist = Blocklist{Users: []string{"9"}}
	if got, err := s.Put(ctx, "1001", drop); err != nil || got.Preset != PresetDrop {
		t.Errorf("Put of the drop knobs: preset %q, %v; want drop", got.Preset, err)
	}

	entries, err := s.Audit(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	type row struct{ actor, action string }
	var rows []row
	for _, e := range entries {
		rows = append(rows, row{e.Actor, e.Action})
	}
	wantRows := []row{{"1001", ActionPut}, {"1002", ActionPreset}, {"1001", ActionPut}}
	if !reflect.DeepEqual(rows, wantRows) {
		t.Fatalf("audit (newest first) = %v, want %v", rows, wantRows)
	}
	var body struct {
		Before, After Settings
		Preset        string
	}
	if err := json.Unmarshal(entries[1].Body, &body); err != nil {
		t.Fatal(err)
	}
	if body.Before.Version != 1 || body.After.Version != 2 || body.Preset != PresetUnderAttack ||
		body.Before.RateLimit.PerPrefix.RPS != 100 || body.After.RateLimit.PerIP != p.RateLimit.PerIP {
		t.Errorf("audit body = %s", entries[1].Body)
	}
	if time.Since(entries[0].At) > time.Hour || entries[0].At.Location() != time.UTC {
		t.Errorf("audit time %v", entries[0].At)
	}
	b, err := json.Marshal(entries[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{`"id":`, `"at":`, `"actor":"1001"`, `"action":"settings.put"`, `"body":{`} {
		if !strings.Contains(string(b), k) {
			t.Errorf("audit entry JSON %s lacks %s", b, k)
		}
	}
}

// runGuard runs a Guard against store until the test ends.
func runGuard(t *testing.T, g *Guard, store *Store) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx, store) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// TestGatewaysFollowChanges: two gateways, each with its Guard running
// against one Store, enforce a Put within 2 s: through pub/sub, and through
// the version poll when the announcement is lost.
func TestGatewaysFollowChanges(t *testing.T) {
	tests := []struct {
		name     string
		announce bool
	}{
		{"pub/sub", true},
		{"lost announcement, poll", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			pool := testenv.Postgres(t)
			rdb := testenv.Redis(t)
			var guards []*Guard
			for i := 0; i < 2; i++ {
				g := NewGuard(GuardConfig{PowKey: []byte("k")}, rdb, nil, nil)
				runGuard(t, g, NewStore(pool, rdb, nil))
				guards = append(guards, g)
			}
			writer := NewStore(pool, rdb, nil)
			if !tc.announce {
				writer = NewStore(pool, nil, nil)
			}
			st := DefaultSettings()
			st.Blocklist = Blocklist{CIDRs: []string{"203.0.113.0/24"}, Users: []string{"42"}}
			if _, err := writer.Put(ctx, "1", st); err != nil {
				t.Fatal(err)
			}
			put := time.Now()
			for i, g := range guards {
				testenv.Eventually(t, fmt.Sprintf("gateway %d to apply the change within 2 s", i), time.Until(put.Add(2*time.Second)), func() bool {
					_, err := g.CheckUser(42, ClassPurchase)
					return flashsale.ErrorCode(err) == flashsale.CodeBlocked
				})
				if _, err := g.CheckAddr(testIP, ClassRead); err != nil {
					t.Errorf("gateway %d: unblocked address: %v", i, err)
				}
				if _, err := g.CheckAddr(netipMust("203.0.113.4"), ClassRead); flashsale.ErrorCode(err) != flashsale.CodeBlocked {
					t.Errorf("gateway %d: blocked CIDR: %v", i, err)
				}
			}
			t.Logf("applied on both gateways %v after Put", time.Since(put).Round(time.Millisecond))
		})
	}
}

func TestJSONStore(t *testing.T) {
	ctx := context.Background()
	j := NewStore(testenv.Postgres(t), nil, nil).JSON()
	if a, err := j.Audit(ctx, 5); err != nil || string(a) != "[]" {
		t.Errorf("empty audit = %s, %v; want []", a, err)
	}
	if _, err := j.Put(ctx, "1", json.RawMessage(`{"rateLimit":{"perIp":{"rps":-1,"burst":1}}}`)); flashsale.ErrorCode(err) != flashsale.CodeInvalid {
		t.Errorf("invalid document: %v, want INVALID", err)
	}
	out, err := j.Put(ctx, "1", json.RawMessage(contractExample))
	if err != nil {
		t.Fatal(err)
	}
	// The contract example has the knobs of the normal preset.
	want := `{"preset":"normal",` + contractExample[1:len(contractExample)-1] + `,"version":1}`
	if got, _ := j.Get(ctx); string(got) != string(out) || string(out) != want {
		t.Errorf("Put answered %s, Get %s; want %s", out, got, want)
	}
	if out, err := j.ApplyPreset(ctx, "1", PresetDrop); err != nil || !strings.Contains(string(out), `"preset":"drop"`) {
		t.Errorf("ApplyPreset = %s, %v", out, err)
	}
	var entries []AuditEntry
	a, err := j.Audit(ctx, 5)
	if err != nil || json.Unmarshal(a, &entries) != nil || len(entries) != 2 || entries[0].Action != ActionPreset {
		t.Errorf("audit = %s, %v", a, err)
	}
}
