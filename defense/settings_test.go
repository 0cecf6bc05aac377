package defense

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/flashsale/flashsale"
)

const contractExample = `{"rateLimit":{"perIp":{"rps":20,"burst":40},"perUser":{"rps":5,"burst":10},"perPrefix":{"rps":50,"burst":80}},"pow":{"difficulty":0},"blocklist":{"cidrs":["203.0.113.0/24"],"users":["42"]}}`

func TestSettingsJSONMatchesContract(t *testing.T) {
	st, err := ParseSettings([]byte(contractExample))
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != contractExample {
		t.Errorf("round trip:\n got %s\nwant %s", b, contractExample)
	}
	d := DefaultSettings()
	b, err = json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Replace(contractExample, `"cidrs":["203.0.113.0/24"],"users":["42"]`, `"cidrs":[],"users":[]`, 1)
	if string(b) != want {
		t.Errorf("defaults:\n got %s\nwant %s", b, want)
	}
}

func TestParseSettingsValidation(t *testing.T) {
	tests := []struct {
		name     string
		body     string
		wantWord string // the field the message must name; "" = valid
	}{
		{"contract example", contractExample, ""},
		{"extensions", `{"rateLimit":{"perIp":{"rps":0.5,"burst":1},"perUser":{"rps":5,"burst":10},"perPrefix":{"rps":100,"burst":200},
			"classes":{"purchase":{"perUser":{"rps":1,"burst":2}}}},"pow":{"difficulty":0,"solveSeconds":2,"hashRate":1000},
			"blocklist":{"cidrs":[],"users":[]},"shadow":{"perPrefix":true}}`, ""},
		{"negative rps", `{"rateLimit":{"perIp":{"rps":-1,"burst":40}}}`, "rateLimit.perIp.rps"},
		{"burst zero with rps", `{"rateLimit":{"perUser":{"rps":5,"burst":0}}}`, "rateLimit.perUser.burst"},
		{"huge burst", `{"rateLimit":{"perPrefix":{"rps":5,"burst":100000000}}}`, "rateLimit.perPrefix.burst"},
		{"bad class name", `{"rateLimit":{"classes":{"Pur chase":{"perIp":{"rps":1,"burst":1}}}}}`, "rateLimit.classes"},
		{"bad class limit", `{"rateLimit":{"classes":{"join":{"perUser":{"rps":1,"burst":0}}}}}`, "rateLimit.classes.join.perUser.burst"},
		{"bad cidr", `{"blocklist":{"cidrs":["203.0.113.0/24","nope"]}}`, "blocklist.cidrs[1]"},
		{"bad user", `{"blocklist":{"users":["42","x"]}}`, "blocklist.users[1]"},
		{"user zero", `{"blocklist":{"users":["0"]}}`, "blocklist.users[0]"},
		{"user as number", `{"blocklist":{"users":[42]}}`, "blocklist.users"},
		{"difficulty too high", `{"pow":{"difficulty":10000000000000}}`, "pow.difficulty"},
		{"difficulty negative", `{"pow":{"difficulty":-1}}`, "pow.difficulty"},
		{"solveSeconds too high", `{"pow":{"solveSeconds":100000}}`, "pow.solveSeconds"},
		{"hashRate negative", `{"pow":{"hashRate":-3}}`, "pow.hashRate"},
		{"unknown shadow rule", `{"shadow":{"perIP":true}}`, "shadow"},
		{"unknown field", `{"rateLimit":{"perHost":{"rps":1,"burst":1}}}`, "perHost"},
		{"rps as string", `{"rateLimit":{"perIp":{"rps":"20","burst":40}}}`, "rateLimit.perIp.rps"},
		{"not json", `{"rateLimit":`, "JSON"},
		{"trailing data", contractExample + `{}`, "trailing"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseSettings([]byte(tc.body))
			if tc.wantWord == "" {
				if err != nil {
					t.Fatalf("ParseSettings: %v", err)
				}
				return
			}
			if got := flashsale.ErrorCode(err); got != flashsale.CodeInvalid {
				t.Fatalf("code = %q (%v), want INVALID", got, err)
			}
			if msg := flashsale.ErrorMessage(err); !strings.Contains(msg, tc.wantWord) {
				t.Errorf("message %q does not name %q", msg, tc.wantWord)
			}
		})
	}
}

func TestParseSettingsNormalizes(t *testing.T) {
	st, err := ParseSettings([]byte(`{"rateLimit":{"perIp":{"rps":1,"burst":1},"perUser":{"rps":1,"burst":1},
		"classes":{"read":{}}},"pow":{"difficulty":7,"solveSeconds":2,"hashRate":1000},
		"blocklist":{"cidrs":["203.0.113.9/24"," 2001:db8::1 ","203.0.113.0/24","::ffff:198.51.100.1"],"users":[" 042","42","7"]},
		"shadow":{"perIp":false},"preset":"drop","version":99}`))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := st.Blocklist.CIDRs, []string{"203.0.113.0/24", "2001:db8::1/128", "198.51.100.1/32"}; !reflect.DeepEqual(got, want) {
		t.Errorf("cidrs = %q, want %q", got, want)
	}
	if got, want := st.Blocklist.Users, []string{"42", "7"}; !reflect.DeepEqual(got, want) {
		t.Errorf("users = %q, want %q", got, want)
	}
	if st.Pow.Difficulty != 2000 {
		t.Errorf("difficulty = %d, want 2000 (2 s × 1000/s)", st.Pow.Difficulty)
	}
	if st.RateLimit.Classes != nil || st.Shadow != nil || st.Preset != "" || st.Version != 0 {
		t.Errorf("empty class, false shadow, preset and version not cleared: %+v", st)
	}
}

func TestPresetsValidAndDistinct(t *testing.T) {
	ps := Presets()
	for _, name := range []string{PresetNormal, PresetDrop, PresetUnderAttack} {
		p, ok := ps[name]
		if !ok {
			t.Fatalf("preset %q missing", name)
		}
		if err := p.Validate(); err != nil {
			t.Errorf("preset %q: %v", name, err)
		}
		if got := presetName(p); got != name {
			t.Errorf("presetName(%s) = %q", name, got)
		}
	}
	if ps[PresetUnderAttack].Pow.Difficulty <= ps[PresetDrop].Pow.Difficulty || ps[PresetDrop].Pow.Difficulty == 0 {
		t.Errorf("pow difficulty should rise normal < drop < under-attack: %d, %d", ps[PresetDrop].Pow.Difficulty, ps[PresetUnderAttack].Pow.Difficulty)
	}
	if ps[PresetUnderAttack].RateLimit.PerIP.RPS >= ps[PresetNormal].RateLimit.PerIP.RPS {
		t.Error("under-attack should limit addresses harder than normal")
	}
}

func FuzzParseSettings(f *testing.F) {
	f.Add([]byte(contractExample))
	f.Add([]byte(`{"rateLimit":{"perPrefix":{"rps":1e6,"burst":1},"classes":{"a":{"perIp":{"rps":1,"burst":1}}}},"shadow":{"pow":true}}`))
	f.Add([]byte(`{"pow":{"solveSeconds":0.000001,"hashRate":1}}`))
	f.Add([]byte(`{"blocklist":{"cidrs":["::ffff:1.2.3.4/120","1.2.3.4"],"users":["9223372036854775807"]}}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := ParseSettings(data)
		if err != nil {
			if flashsale.ErrorCode(err) != flashsale.CodeInvalid {
				t.Fatalf("error %v is not INVALID", err)
			}
			return
		}
		// Valid settings are a fixed point: marshal, parse, same value.
		b, err := json.Marshal(st)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		st2, err := ParseSettings(b)
		if err != nil {
			t.Fatalf("reparse of %s: %v", b, err)
		}
		if !reflect.DeepEqual(st, st2) {
			t.Fatalf("not a fixed point:\n%+v\n%+v", st, st2)
		}
		// And a Guard can enforce them.
		g := NewGuard(GuardConfig{PowKey: []byte("k")}, nil, nil, nil)
		g.Apply(st)
		if g.Settings().Pow.Difficulty != st.Pow.Difficulty {
			t.Fatal("Apply did not take valid settings")
		}
	})
}
