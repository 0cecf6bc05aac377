package flashsale

import (
	"bytes"
	"testing"
	"time"
)

func TestParseAccess(t *testing.T) {
	t0 := "2026-12-01T18:00:00Z"
	t1 := "2026-12-01T19:00:00Z"
	t2 := "2026-12-01T20:00:00Z"
	for _, tt := range []struct {
		name, in string
		field    string // the INVALID message's field; "" accepted
	}{
		{"open", `{"rule":"open"}`, ""},
		{"codes", `{"rule":"codes"}`, ""},
		{"allowlist with a presale", `{"rule":"allowlist","publicFrom":"` + t1 + `","tiers":[{"tier":1,"joinFrom":"` + t0 + `"}]}`, ""},
		{"members' hour", `{"rule":"open","publicFrom":"` + t2 + `","tiers":[{"tier":1,"joinFrom":"` + t0 + `"},{"tier":2,"joinFrom":"` + t1 + `"}]}`, ""},
		{"tiers without times", `{"rule":"codes","tiers":[{"tier":1},{"tier":3}]}`, ""},
		{"draw by tier", `{"rule":"codes","tiers":[{"tier":1},{"tier":2}],"drawByTier":true}`, ""},
		{"open, draw by token tier", `{"rule":"open","drawByTier":true}`, ""},
		{"drawByTier not a bool", `{"rule":"open","drawByTier":"yes"}`, "access"},
		{"no rule", `{}`, "access.rule"},
		{"unknown rule", `{"rule":"invite"}`, "access.rule"},
		{"unknown field", `{"rule":"open","from":"x"}`, "access"},
		{"not an object", `"open"`, "access"},
		{"trailing data", `{"rule":"open"} {}`, "access"},
		{"bad time", `{"rule":"open","publicFrom":"tomorrow"}`, "access.publicFrom"},
		{"tier 0", `{"rule":"codes","tiers":[{"tier":0}]}`, "access.tiers[0].tier"},
		{"tier 10", `{"rule":"codes","tiers":[{"tier":10}]}`, "access.tiers[0].tier"},
		{"tiers descending", `{"rule":"codes","tiers":[{"tier":2},{"tier":1}]}`, "access.tiers[1].tier"},
		{"tier twice", `{"rule":"codes","tiers":[{"tier":1},{"tier":1}]}`, "access.tiers[1].tier"},
		{"later tier earlier", `{"rule":"codes","tiers":[{"tier":1,"joinFrom":"` + t1 + `"},{"tier":2,"joinFrom":"` + t0 + `"}]}`, "access.tiers[1].joinFrom"},
		{"later tier any time", `{"rule":"codes","tiers":[{"tier":1,"joinFrom":"` + t1 + `"},{"tier":2}]}`, "access.tiers[1].joinFrom"},
		{"public before tier", `{"rule":"codes","publicFrom":"` + t0 + `","tiers":[{"tier":1,"joinFrom":"` + t1 + `"}]}`, "access.publicFrom"},
		{"public with the tier", `{"rule":"codes","publicFrom":"` + t0 + `","tiers":[{"tier":1,"joinFrom":"` + t0 + `"}]}`, "access.publicFrom"},
		{"open members without public", `{"rule":"open","tiers":[{"tier":1,"joinFrom":"` + t0 + `"}]}`, "access.publicFrom"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, err := ParseAccess([]byte(tt.in))
			if tt.field == "" {
				if err != nil {
					t.Fatalf("ParseAccess: %v", err)
				}
				// What parses writes back and parses to the same rule.
				b, err := a.MarshalJSON()
				if err != nil {
					t.Fatal(err)
				}
				again, err := ParseAccess(b)
				if err != nil || !sameAccess(a, again) {
					t.Fatalf("round trip %s: %+v, %v; want %+v", b, again, err, a)
				}
				return
			}
			if ErrorCode(err) != CodeInvalid || !bytes.HasPrefix([]byte(ErrorMessage(err)), []byte(tt.field+":")) {
				t.Fatalf("err = %v, want INVALID about %s", err, tt.field)
			}
		})
	}
}

func sameAccess(a, b SaleAccess) bool {
	if a.RuleName() != b.RuleName() || !a.PublicFrom.Equal(b.PublicFrom) || len(a.Tiers) != len(b.Tiers) || a.DrawByTier != b.DrawByTier {
		return false
	}
	for i := range a.Tiers {
		if a.Tiers[i].Tier != b.Tiers[i].Tier || !a.Tiers[i].JoinFrom.Equal(b.Tiers[i].JoinFrom) {
			return false
		}
	}
	return true
}

// TestDrawByTierIsNotPlain: an open sale that draws by tier reads the
// token's tier at every join, so the join path must look (Plain false).
func TestDrawByTierIsNotPlain(t *testing.T) {
	if (SaleAccess{}).Plain() != true || (SaleAccess{DrawByTier: true}).Plain() != false {
		t.Fatal("Plain: want true for the zero rule, false with DrawByTier")
	}
}

func TestAccessJoinFrom(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 18, 0, 0, 0, time.UTC)
	a := SaleAccess{Rule: AccessCodes, PublicFrom: t0.Add(2 * time.Hour),
		Tiers: []AccessTier{{Tier: 1, JoinFrom: t0}, {Tier: 2, JoinFrom: t0.Add(time.Hour)}}}
	for tier, want := range map[int]time.Time{0: a.PublicFrom, 1: t0, 2: t0.Add(time.Hour), 3: a.PublicFrom} {
		if got := a.JoinFrom(tier); !got.Equal(want) {
			t.Errorf("JoinFrom(%d) = %v, want %v", tier, got, want)
		}
	}
	if (SaleAccess{}).Plain() != true || (SaleAccess{Rule: AccessOpen}).Plain() != true || a.Plain() {
		t.Error("Plain: want true for the zero and the bare open rule only")
	}
}

// FuzzParseAccess: any input is a valid rule or INVALID, and a valid one
// round-trips.
func FuzzParseAccess(f *testing.F) {
	for _, s := range []string{`{"rule":"open"}`, `{"rule":"codes","publicFrom":"2026-12-01T18:00:00.7Z","tiers":[{"tier":1,"joinFrom":"2026-12-01T18:00:00.5Z"}]}`, `{"rule":"codes","publicFrom":"2026-12-01T18:00:00Z","tiers":[{"tier":1,"joinFrom":"2026-12-01T17:00:00Z"}]}`,
		`{"rule":"allowlist","tiers":[{"tier":2},{"tier":1}]}`, `{}`, `[]`, `{"rule":"open","tiers":null}`, `{"rule":"codes","drawByTier":true}`, "\x00"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := ParseAccess(b)
		if err != nil {
			if ErrorCode(err) != CodeInvalid {
				t.Fatalf("error code %s, want INVALID", ErrorCode(err))
			}
			return
		}
		if err := a.Validate(); err != nil {
			t.Fatalf("accepted an invalid rule %+v: %v", a, err)
		}
		out, err := a.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		again, err := ParseAccess(out)
		if err != nil || !sameAccess(a, again) {
			t.Fatalf("round trip of %q: %s → %+v, %v", b, out, again, err)
		}
	})
}
