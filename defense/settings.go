package defense

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/flashsale/flashsale"
)

// Rule names, as used in Settings.Shadow, counters and metrics.
const (
	RuleBlocklist = "blocklist"
	RulePerIP     = "perIp"
	RulePerPrefix = "perPrefix"
	RulePerUser   = "perUser"
	RulePow       = "pow"
)

// Decision outcomes, as used in counters and metrics.
const (
	OutcomeAllowed    = "allowed"
	OutcomeLimited    = "limited"
	OutcomeBlocked    = "blocked"
	OutcomeChallenged = "challenged"
	OutcomeShadow     = "shadow"
	// OutcomeShadowQueue: sent to the sale's shadow queue (ShadowQueue).
	OutcomeShadowQueue = "shadowQueue"
)

// Route classes the gateway and waiting room use. Settings may name other
// classes too; a class without an override shares the default buckets.
const (
	ClassJoin     = "join"
	ClassPurchase = "purchase"
	ClassRead     = "read"
	ClassAdmin    = "admin"
	// ClassDraw is the public draw record. Unless the settings override it
	// (rateLimit.classes.draw), it has its own per-address buckets at
	// DefaultDrawPerIP.
	ClassDraw = "draw"
)

// DefaultDrawPerIP is the draw class's per-address limit when the
// settings name none: a record never changes, so a client needs it once
// and a CDN a few times.
func DefaultDrawPerIP() Limit { return Limit{RPS: 1, Burst: 10} }

// DefaultHashRate is the assumed proof-of-work hash rate of a shopper's
// browser (SHA-256 per second, one Web Worker) used to turn
// pow.solveSeconds into a difficulty when pow.hashRate is 0. See POW.md.
const DefaultHashRate = 500_000

// Validation bounds.
const (
	maxRPS          = 1_000_000
	maxBurst        = 1_000_000
	maxDifficulty   = 1 << 40 // nonces stay far below 2^53 (exact in JavaScript)
	maxSolveSeconds = 600
	maxHashRate     = 1e10
	maxClasses      = 32
	maxBlockCIDRs   = 100_000
	maxBlockUsers   = 100_000
)

// Settings is the operator's bot-defense configuration (CONTRACT section 3
// plus extensions). The zero value of a Limit disables that rule; the zero
// pow difficulty disables proof of work.
//
//	{"preset": "custom",
//	 "rateLimit": {"perIp": {"rps": 20, "burst": 40},
//	               "perUser": {"rps": 5, "burst": 10},
//	               "perPrefix": {"rps": 50, "burst": 80},
//	               "classes": {"purchase": {"perUser": {"rps": 1, "burst": 3}}}},
//	 "pow": {"difficulty": 500000, "solveSeconds": 1, "hashRate": 500000},
//	 "blocklist": {"cidrs": ["203.0.113.0/24"], "users": ["42"]},
//	 "shadow": {"perPrefix": true},
//	 "version": 7}
type Settings struct {
	// Preset names the preset these knobs equal ("normal", "drop",
	// "under-attack"), or "custom". Set by the Store; ignored on input.
	Preset    string     `json:"preset,omitempty"`
	RateLimit RateLimits `json:"rateLimit"`
	Pow       Pow        `json:"pow"`
	Blocklist Blocklist  `json:"blocklist"`
	// Shadow lists rules (RulePerIP, ...) that only count what they would
	// refuse (outcome "shadow") without refusing: a dry run.
	Shadow map[string]bool `json:"shadow,omitempty"`
	// ShadowQueue sends joins to the sale's shadow queue rather than
	// refusing them: the shopper waits on a page like anyone's and is
	// never admitted.
	ShadowQueue ShadowQueue `json:"shadowQueue,omitzero"`
	// Version is the stored version, set by the Store; ignored on input.
	Version int64 `json:"version,omitempty"`
}

// Limit is a token bucket: rps tokens per second, at most burst at once.
// rps 0 disables the rule.
type Limit struct {
	RPS   float64 `json:"rps"`
	Burst int     `json:"burst"`
}

// Enabled reports whether the limit is on.
func (l Limit) Enabled() bool { return l.RPS > 0 }

// RateLimits are the default limits of every rule plus per-class overrides.
// perPrefix keys an IPv4 address by its /24 and an IPv6 address by its /64.
type RateLimits struct {
	PerIP     Limit `json:"perIp"`
	PerUser   Limit `json:"perUser"`
	PerPrefix Limit `json:"perPrefix,omitzero"`
	// Classes overrides rules for one route class. A class with an override
	// for a rule has its own buckets for that rule; every other request
	// shares the default buckets.
	Classes map[string]ClassLimits `json:"classes,omitempty"`
}

// ClassLimits overrides some rules for one route class; nil keeps the
// default.
type ClassLimits struct {
	PerIP     *Limit `json:"perIp,omitempty"`
	PerUser   *Limit `json:"perUser,omitempty"`
	PerPrefix *Limit `json:"perPrefix,omitempty"`
}

// Pow configures proof of work at queue join.
type Pow struct {
	// Difficulty is the expected number of SHA-256 hashes a solution costs;
	// 0 disables proof of work. When SolveSeconds > 0 the Store sets it to
	// SolveSeconds × HashRate.
	Difficulty uint64 `json:"difficulty"`
	// SolveSeconds is the expected solve time in a browser; 0: use
	// Difficulty as given.
	SolveSeconds float64 `json:"solveSeconds,omitempty"`
	// HashRate is the assumed browser hash rate for SolveSeconds; 0:
	// DefaultHashRate.
	HashRate float64 `json:"hashRate,omitempty"`
}

// ShadowQueue is which joins go to a sale's shadow queue (waitroom,
// shadow.go) instead of being refused. Rules: "blocklist" (a blocklisted
// address or user), "pow" (a join whose proof of work is wrong, forged,
// reused or, after a challenge, missing), "perAddress" (a WebSocket over
// the waiting room's per-address cap, up to four times the cap),
// "identity" (a second user id of an identity key, instead of
// DUPLICATE_IDENTITY). RiskAbove (0 to 1; 0 off) shadows a join whose
// token's risk claim is above it.
type ShadowQueue struct {
	Rules     map[string]bool `json:"rules,omitempty"`
	RiskAbove float64         `json:"riskAbove,omitempty"`
}

// Shadow-queue rule names (ShadowQueue.Rules).
const (
	ShadowBlocklist  = "blocklist"
	ShadowPow        = "pow"
	ShadowPerAddress = "perAddress"
	ShadowIdentity   = "identity"
)

var shadowRuleNames = [...]string{ShadowBlocklist, ShadowPow, ShadowPerAddress, ShadowIdentity}

// Blocklist refuses addresses and users with BLOCKED.
type Blocklist struct {
	CIDRs []string `json:"cidrs"` // CIDRs or single addresses
	Users []string `json:"users"` // user ids, decimal
}

// DefaultSettings are the settings before an operator stored any: the
// values of CONTRACT section 3, no proof of work, an empty blocklist.
//
// The per-prefix limit (an IPv4 /24, an IPv6 /64) is on: without it one
// subscriber's /64, or a rented /24, gets the per-address limit once per
// address. It allows two and a half addresses' worth of the per-address
// limit, so a NAT (one address, held to the per-address limit anyway) is
// never hurt by it, nor are a few dozen shoppers of one network each
// loading a page.
func DefaultSettings() Settings {
	return Settings{
		RateLimit: RateLimits{
			PerIP:     Limit{RPS: 20, Burst: 40},
			PerUser:   Limit{RPS: 5, Burst: 10},
			PerPrefix: Limit{RPS: 50, Burst: 80},
		},
		Blocklist: Blocklist{CIDRs: []string{}, Users: []string{}},
	}
}

// Preset names.
const (
	PresetNormal      = "normal"
	PresetDrop        = "drop"
	PresetUnderAttack = "under-attack"
	PresetCustom      = "custom"
)

// Presets returns the named presets. Applying one switches every knob
// except the blocklist at once.
//
//   - normal: the defaults.
//   - drop: a sale is opening; joins and purchases get their own tighter
//     per-user budgets, a light proof of work (~1 s) at join.
//   - under-attack: tight per-address, per-prefix and per-user limits and a
//     heavier proof of work (~5 s).
func Presets() map[string]Settings {
	lim := func(rps float64, burst int) *Limit { return &Limit{RPS: rps, Burst: burst} }
	normal := DefaultSettings()
	normal.Preset = PresetNormal

	drop := DefaultSettings()
	drop.Preset = PresetDrop
	drop.RateLimit.Classes = map[string]ClassLimits{
		ClassJoin:     {PerUser: lim(1, 5), PerIP: lim(5, 20)},
		ClassPurchase: {PerUser: lim(2, 4)},
	}
	drop.Pow = Pow{SolveSeconds: 1}

	attack := DefaultSettings()
	attack.Preset = PresetUnderAttack
	attack.RateLimit.PerIP = Limit{RPS: 5, Burst: 10}
	attack.RateLimit.PerUser = Limit{RPS: 2, Burst: 5}
	attack.RateLimit.PerPrefix = Limit{RPS: 25, Burst: 50}
	attack.RateLimit.Classes = map[string]ClassLimits{
		ClassJoin:     {PerUser: lim(0.2, 3), PerIP: lim(1, 3)},
		ClassPurchase: {PerUser: lim(1, 2)},
	}
	attack.Pow = Pow{SolveSeconds: 5}

	out := map[string]Settings{PresetNormal: normal, PresetDrop: drop, PresetUnderAttack: attack}
	for k, v := range out {
		if err := v.normalize(); err != nil {
			panic("defense: invalid preset " + k + ": " + err.Error()) // a programming error, caught by tests
		}
		out[k] = v
	}
	return out
}

// ParseSettings decodes and validates settings sent by an operator.
// Unknown fields, trailing data and invalid values are an INVALID
// *flashsale.Error naming the field. The result is normalized: CIDRs are
// canonical, users are canonical decimal, Difficulty follows SolveSeconds.
// Preset and Version are cleared (the Store sets them).
func ParseSettings(data []byte) (Settings, error) {
	st, err := decodeSettings(data, true)
	if err != nil {
		return Settings{}, err
	}
	st.Preset, st.Version = "", 0
	if err := st.normalize(); err != nil {
		return Settings{}, err
	}
	return st, nil
}

// decodeSettings decodes JSON; strict refuses unknown fields (operator
// input), lenient accepts them (bodies stored by a newer build).
func decodeSettings(data []byte, strict bool) (Settings, error) {
	var st Settings
	dec := json.NewDecoder(bytes.NewReader(data))
	if strict {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(&st); err != nil {
		return Settings{}, invalidJSON(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Settings{}, flashsale.Errorf(flashsale.CodeInvalid, "settings: trailing data after the JSON object")
	}
	return st, nil
}

func invalidJSON(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return flashsale.Errorf(flashsale.CodeInvalid, "%s: must be a %s", te.Field, te.Type.String())
	}
	msg := err.Error()
	if f, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		return flashsale.Errorf(flashsale.CodeInvalid, "unknown field %s", truncate(f, 80))
	}
	return flashsale.Errorf(flashsale.CodeInvalid, "settings: not valid JSON")
}

// Validate checks st and returns an INVALID *flashsale.Error naming the
// first bad field.
func (st Settings) Validate() error {
	c := st.clone()
	return c.normalize()
}

// normalize validates st in place and canonicalizes it.
func (st *Settings) normalize() error {
	rl := &st.RateLimit
	for _, f := range []struct {
		name string
		l    *Limit
	}{
		{"rateLimit.perIp", &rl.PerIP},
		{"rateLimit.perUser", &rl.PerUser},
		{"rateLimit.perPrefix", &rl.PerPrefix},
	} {
		if err := checkLimit(f.name, *f.l); err != nil {
			return err
		}
	}
	if len(rl.Classes) > maxClasses {
		return flashsale.Errorf(flashsale.CodeInvalid, "rateLimit.classes: at most %d classes", maxClasses)
	}
	for name, c := range rl.Classes {
		if !validClassName(name) {
			return flashsale.Errorf(flashsale.CodeInvalid, "rateLimit.classes: %q is not a class name (1-32 of a-z 0-9 - _)", truncate(name, 40))
		}
		for rule, l := range map[string]*Limit{RulePerIP: c.PerIP, RulePerUser: c.PerUser, RulePerPrefix: c.PerPrefix} {
			if l != nil {
				if err := checkLimit("rateLimit.classes."+name+"."+rule, *l); err != nil {
					return err
				}
			}
		}
		if c.PerIP == nil && c.PerUser == nil && c.PerPrefix == nil {
			delete(rl.Classes, name)
		}
	}
	if len(rl.Classes) == 0 {
		rl.Classes = nil
	}

	p := &st.Pow
	if math.IsNaN(p.SolveSeconds) || p.SolveSeconds < 0 || p.SolveSeconds > maxSolveSeconds {
		return flashsale.Errorf(flashsale.CodeInvalid, "pow.solveSeconds: must be between 0 and %d", maxSolveSeconds)
	}
	if math.IsNaN(p.HashRate) || p.HashRate < 0 || p.HashRate > maxHashRate {
		return flashsale.Errorf(flashsale.CodeInvalid, "pow.hashRate: must be between 0 and %g", float64(maxHashRate))
	}
	if p.SolveSeconds > 0 {
		rate := p.HashRate
		if rate == 0 {
			rate = DefaultHashRate
		}
		d := math.Round(p.SolveSeconds * rate)
		if d < 1 {
			d = 1
		}
		if d > maxDifficulty {
			return flashsale.Errorf(flashsale.CodeInvalid, "pow.solveSeconds: solveSeconds × hashRate must be at most %d hashes", uint64(maxDifficulty))
		}
		p.Difficulty = uint64(d)
	}
	if p.Difficulty > maxDifficulty {
		return flashsale.Errorf(flashsale.CodeInvalid, "pow.difficulty: must be between 0 and %d", uint64(maxDifficulty))
	}

	b := &st.Blocklist
	if len(b.CIDRs) > maxBlockCIDRs {
		return flashsale.Errorf(flashsale.CodeInvalid, "blocklist.cidrs: at most %d entries", maxBlockCIDRs)
	}
	if len(b.Users) > maxBlockUsers {
		return flashsale.Errorf(flashsale.CodeInvalid, "blocklist.users: at most %d entries", maxBlockUsers)
	}
	cidrs := make([]string, 0, len(b.CIDRs))
	seen := make(map[string]bool, len(b.CIDRs))
	for i, s := range b.CIDRs {
		pfx, err := parsePrefix(strings.TrimSpace(s))
		if err != nil {
			return flashsale.Errorf(flashsale.CodeInvalid, "blocklist.cidrs[%d]: %q is not a CIDR or address", i, truncate(s, 64))
		}
		if c := pfx.String(); !seen[c] {
			seen[c] = true
			cidrs = append(cidrs, c)
		}
	}
	b.CIDRs = cidrs
	users := make([]string, 0, len(b.Users))
	clear(seen)
	for i, s := range b.Users {
		id, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil || id <= 0 {
			return flashsale.Errorf(flashsale.CodeInvalid, "blocklist.users[%d]: %q is not a user id", i, truncate(s, 40))
		}
		if c := strconv.FormatInt(id, 10); !seen[c] {
			seen[c] = true
			users = append(users, c)
		}
	}
	b.Users = users

	for rule, on := range st.Shadow {
		if !knownRule(rule) {
			return flashsale.Errorf(flashsale.CodeInvalid, "shadow: %q is not a rule (%s)", truncate(rule, 40), strings.Join(ruleNames[:], ", "))
		}
		if !on {
			delete(st.Shadow, rule)
		}
	}
	if len(st.Shadow) == 0 {
		st.Shadow = nil
	}
	q := &st.ShadowQueue
	for rule, on := range q.Rules {
		if !slices.Contains(shadowRuleNames[:], rule) {
			return flashsale.Errorf(flashsale.CodeInvalid, "shadowQueue.rules: %q is not a rule (%s)", truncate(rule, 40), strings.Join(shadowRuleNames[:], ", "))
		}
		if !on {
			delete(q.Rules, rule)
		}
	}
	if len(q.Rules) == 0 {
		q.Rules = nil
	}
	if math.IsNaN(q.RiskAbove) || q.RiskAbove < 0 || q.RiskAbove >= 1 {
		return flashsale.Errorf(flashsale.CodeInvalid, "shadowQueue.riskAbove: must be at least 0 (off) and below 1")
	}
	return nil
}

func checkLimit(name string, l Limit) error {
	if math.IsNaN(l.RPS) || l.RPS < 0 || l.RPS > maxRPS {
		return flashsale.Errorf(flashsale.CodeInvalid, "%s.rps: must be between 0 and %d", name, maxRPS)
	}
	if l.Burst < 0 || l.Burst > maxBurst {
		return flashsale.Errorf(flashsale.CodeInvalid, "%s.burst: must be between 0 and %d", name, maxBurst)
	}
	if l.RPS > 0 && l.Burst < 1 {
		return flashsale.Errorf(flashsale.CodeInvalid, "%s.burst: must be at least 1 when rps > 0", name)
	}
	return nil
}

func validClassName(s string) bool {
	if len(s) == 0 || len(s) > 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

var ruleNames = [...]string{RuleBlocklist, RulePerIP, RulePerPrefix, RulePerUser, RulePow}

func knownRule(s string) bool {
	for _, r := range ruleNames {
		if r == s {
			return true
		}
	}
	return false
}

// clone returns a deep copy.
func (st Settings) clone() Settings {
	c := st
	if st.RateLimit.Classes != nil {
		c.RateLimit.Classes = make(map[string]ClassLimits, len(st.RateLimit.Classes))
		for k, v := range st.RateLimit.Classes {
			c.RateLimit.Classes[k] = ClassLimits{PerIP: clonePtr(v.PerIP), PerUser: clonePtr(v.PerUser), PerPrefix: clonePtr(v.PerPrefix)}
		}
	}
	c.Blocklist.CIDRs = append([]string(nil), st.Blocklist.CIDRs...)
	c.Blocklist.Users = append([]string(nil), st.Blocklist.Users...)
	if st.Shadow != nil {
		c.Shadow = make(map[string]bool, len(st.Shadow))
		for k, v := range st.Shadow {
			c.Shadow[k] = v
		}
	}
	c.ShadowQueue.Rules = maps.Clone(st.ShadowQueue.Rules)
	return c
}

func clonePtr(l *Limit) *Limit {
	if l == nil {
		return nil
	}
	v := *l
	return &v
}

// knobs is the JSON of everything a preset sets (no blocklist, preset or
// version), for comparing settings with presets.
func (st Settings) knobs() string {
	c := st
	c.Preset, c.Version = "", 0
	c.Blocklist = Blocklist{}
	b, err := json.Marshal(c) // map keys are sorted: stable
	if err != nil {
		return fmt.Sprintf("unmarshalable: %v", err)
	}
	return string(b)
}

// presetName names the preset whose knobs st has, or PresetCustom.
func presetName(st Settings) string {
	k := st.knobs()
	names := make([]string, 0, 3)
	for name, p := range Presets() {
		if p.knobs() == k {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return PresetCustom
	}
	sort.Strings(names)
	return names[0]
}
