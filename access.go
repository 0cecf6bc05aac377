package flashsale

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// Access rules of a sale: who may join its queue (Sale.Access).
const (
	// AccessOpen: anyone with an access token (the rule of a sale that
	// names none).
	AccessOpen = "open"
	// AccessCodes: a shopper joins with an invitation code the operator
	// handed out; redeeming it binds it to the shopper for the sale.
	AccessCodes = "codes"
	// AccessAllowlist: the users the operator uploaded, and shoppers
	// whose access token carries a tier from a trusted signer.
	AccessAllowlist = "allowlist"
)

// MaxTier is the largest tier: tiers are 1 (first) to MaxTier.
const MaxTier = 9

// SaleAccess is a sale's access rule. The zero value is open to anyone at
// any time, today's rule, and costs a join nothing (Plain).
//
// A shopper's tier (0: none) comes from a redeemed code, the allowlist or
// a trusted token claim (Principal.Tier). A shopper of tier t may join
// from JoinFrom(t); a shopper of no tier may join an open sale from
// PublicFrom (any time when zero) and a codes or allowlist sale only from
// PublicFrom, when set (the open sale after a presale).
//
// DrawByTier orders the pre-queue's draw by tier: tier 1's tickets take the
// first places, then tier 2's, and so on, then those of no tier, each
// group in its own random order (docs/DRAW.md "Tiers in the draw"). It
// counts as set when the pre-queue closes.
type SaleAccess struct {
	Rule       string       // AccessOpen ("" reads as open), AccessCodes or AccessAllowlist
	PublicFrom time.Time    // zero: none
	Tiers      []AccessTier // ascending by Tier
	DrawByTier bool
}

// AccessTier is a tier's own start.
type AccessTier struct {
	Tier     int       // 1 to MaxTier
	JoinFrom time.Time // zero: any time
}

// Limits of an access rule.
const maxAccessJSON = 4096 // bytes of the access object

// RuleName is the rule as the API names it ("" reads as open).
func (a SaleAccess) RuleName() string {
	if a.Rule == "" {
		return AccessOpen
	}
	return a.Rule
}

// Plain reports whether the rule lets anyone join at any time without a
// look at who they are: the join path does no work for it. A draw by tier
// looks at the token's tier.
func (a SaleAccess) Plain() bool {
	return a.RuleName() == AccessOpen && a.PublicFrom.IsZero() && len(a.Tiers) == 0 && !a.DrawByTier
}

// JoinFrom is when a shopper of tier (0: none) may join: the tier's own
// JoinFrom, or PublicFrom for a tier the rule does not list and for no
// tier. The zero time is any time.
func (a SaleAccess) JoinFrom(tier int) time.Time {
	for _, t := range a.Tiers {
		if t.Tier == tier {
			return t.JoinFrom
		}
	}
	return a.PublicFrom
}

// Validate checks the rule: a known rule, tiers 1 to MaxTier in
// ascending order without repeats, their starts in the same order (a
// later tier never starts before an earlier one) and PublicFrom after
// every tier's start.
func (a SaleAccess) Validate() error {
	switch a.Rule {
	case "", AccessOpen, AccessCodes, AccessAllowlist:
	default:
		return Invalid("access.rule", "must be %q, %q or %q", AccessOpen, AccessCodes, AccessAllowlist)
	}
	if len(a.Tiers) > MaxTier {
		return Invalid("access.tiers", "at most %d tiers", MaxTier)
	}
	var last time.Time
	for i, t := range a.Tiers {
		field := fmt.Sprintf("access.tiers[%d]", i)
		switch {
		case t.Tier < 1 || t.Tier > MaxTier:
			return Invalid(field+".tier", "must be 1 to %d", MaxTier)
		case i > 0 && t.Tier <= a.Tiers[i-1].Tier:
			return Invalid(field+".tier", "tiers must be listed in ascending order, each once")
		case t.JoinFrom.IsZero() && !last.IsZero():
			return Invalid(field+".joinFrom", "required: an earlier tier has a start, and tier %d may not start before it", t.Tier)
		case !t.JoinFrom.IsZero() && t.JoinFrom.Before(last):
			return Invalid(field+".joinFrom", "must not be before the previous tier's (tier %d starts later, not earlier)", t.Tier)
		}
		if !t.JoinFrom.IsZero() {
			last = t.JoinFrom
		}
	}
	if !a.PublicFrom.IsZero() && !last.IsZero() && !a.PublicFrom.After(last) {
		return Invalid("access.publicFrom", "must be after every tier's joinFrom")
	}
	if len(a.Tiers) > 0 && a.PublicFrom.IsZero() && a.RuleName() == AccessOpen && !last.IsZero() {
		return Invalid("access.publicFrom", "required for an open sale whose tiers have a joinFrom: when does everyone else join?")
	}
	return nil
}

// accessJSON is the access object of the API and of the sales table.
type accessJSON struct {
	Rule       string     `json:"rule"`
	PublicFrom string     `json:"publicFrom,omitempty"`
	Tiers      []tierJSON `json:"tiers,omitempty"`
	DrawByTier bool       `json:"drawByTier,omitempty"`
}

type tierJSON struct {
	Tier     int    `json:"tier"`
	JoinFrom string `json:"joinFrom,omitempty"`
}

// MarshalJSON writes the access object: {"rule", "publicFrom", "tiers",
// "drawByTier"} with RFC 3339 times, absent when zero (false).
func (a SaleAccess) MarshalJSON() ([]byte, error) {
	j := accessJSON{Rule: a.RuleName(), PublicFrom: fmtAccessTime(a.PublicFrom), DrawByTier: a.DrawByTier}
	for _, t := range a.Tiers {
		j.Tiers = append(j.Tiers, tierJSON{Tier: t.Tier, JoinFrom: fmtAccessTime(t.JoinFrom)})
	}
	return json.Marshal(j)
}

func fmtAccessTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// ParseAccess reads and validates an access object (the API's "access"):
// unknown fields, a missing rule, malformed times and a rule that does
// not Validate are INVALID, with the field in the message.
func ParseAccess(b []byte) (SaleAccess, error) {
	b = bytes.TrimSpace(b)
	if len(b) > maxAccessJSON {
		return SaleAccess{}, Invalid("access", "at most %d bytes", maxAccessJSON)
	}
	if len(b) == 0 || b[0] != '{' {
		return SaleAccess{}, Invalid("access", "must be a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var j accessJSON
	if err := dec.Decode(&j); err != nil {
		return SaleAccess{}, Invalid("access", "a JSON object of rule, publicFrom, tiers and drawByTier")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return SaleAccess{}, Invalid("access", "data after the object")
	}
	if j.Rule == "" {
		return SaleAccess{}, Invalid("access.rule", "required: %q, %q or %q", AccessOpen, AccessCodes, AccessAllowlist)
	}
	a := SaleAccess{Rule: j.Rule, DrawByTier: j.DrawByTier}
	var err error
	if a.PublicFrom, err = parseAccessTime("access.publicFrom", j.PublicFrom); err != nil {
		return SaleAccess{}, err
	}
	if len(j.Tiers) > MaxTier {
		return SaleAccess{}, Invalid("access.tiers", "at most %d tiers", MaxTier)
	}
	for i, t := range j.Tiers {
		at, err := parseAccessTime(fmt.Sprintf("access.tiers[%d].joinFrom", i), t.JoinFrom)
		if err != nil {
			return SaleAccess{}, err
		}
		a.Tiers = append(a.Tiers, AccessTier{Tier: t.Tier, JoinFrom: at})
	}
	if a.Rule == AccessOpen {
		a.Rule = ""
	}
	if err := a.Validate(); err != nil {
		return SaleAccess{}, err
	}
	return a, nil
}

func parseAccessTime(field, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil || t.Year() < 2000 || t.Year() > 9999 {
		return time.Time{}, Invalid(field, "not an RFC 3339 time")
	}
	return t.UTC(), nil
}

// AccessCode is a sale's invitation code as the operator sees it: it
// may be bound to MaxUses users (1: single use) and gives Tier.
type AccessCode struct {
	Code    string `json:"code"`
	Tier    int    `json:"tier"`
	MaxUses int    `json:"maxUses"`
	Used    int    `json:"used"`
}

// AllowlistEntry is a user of a sale's allowlist, with their tier.
type AllowlistEntry struct {
	UserID int64 `json:"userId"`
	Tier   int   `json:"tier"`
}
