package access

import (
	"bytes"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/flashsale/flashsale"
)

// ParseAllowlist reads an allowlist upload: CSV lines of userId[,tier]
// (a missing tier is 1), an optional header line "userId,tier" and blank
// lines aside. A malformed line, a user listed twice and more than
// MaxAllowlist users are INVALID, with the line in the message.
func ParseAllowlist(b []byte) ([]Entry, error) {
	r := csv.NewReader(bytes.NewReader(b))
	r.FieldsPerRecord = -1
	r.ReuseRecord = true
	var out []Entry
	seen := map[int64]int{}
	for {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			line := 0
			var pe *csv.ParseError
			if errors.As(err, &pe) {
				line = pe.Line
			}
			return nil, flashsale.Invalid("allowlist", "line %d: not CSV", line)
		}
		line, _ := r.FieldPos(0)
		if len(rec) > 2 {
			return nil, flashsale.Invalid("allowlist", "line %d: want userId[,tier]", line)
		}
		first := strings.TrimSpace(rec[0])
		if len(out) == 0 && len(seen) == 0 && strings.EqualFold(first, "userId") {
			continue // the header
		}
		user, err := strconv.ParseInt(first, 10, 64)
		if err != nil || user < 1 {
			return nil, flashsale.Invalid("allowlist", "line %d: %q is not a user id", line, clip(first))
		}
		e := Entry{UserID: user, Tier: 1}
		if len(rec) == 2 {
			t, err := strconv.Atoi(strings.TrimSpace(rec[1]))
			if err != nil || t < 1 || t > flashsale.MaxTier {
				return nil, flashsale.Invalid("allowlist", "line %d: tier must be 1 to %d", line, flashsale.MaxTier)
			}
			e.Tier = t
		}
		if prev, dup := seen[user]; dup {
			return nil, flashsale.Invalid("allowlist", "line %d: user %d is already on line %d", line, user, prev)
		}
		if len(out) == MaxAllowlist {
			return nil, flashsale.Invalid("allowlist", "at most %d users per sale", MaxAllowlist)
		}
		seen[user] = line
		out = append(out, e)
	}
	return out, nil
}

// clip shortens what an error message quotes of the input.
func clip(s string) string {
	if len(s) > 32 {
		return s[:32] + "…"
	}
	return s
}

// WriteAllowlist writes the allowlist as CSV with a header.
func WriteAllowlist(w io.Writer, entries []Entry) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"userId", "tier"})
	for _, e := range entries {
		_ = cw.Write([]string{strconv.FormatInt(e.UserID, 10), strconv.Itoa(e.Tier)})
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("access.WriteAllowlist: %w", err)
	}
	return nil
}

// WriteCodes writes codes as CSV: code, tier, maxUses, used.
func WriteCodes(w io.Writer, codes []Code) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"code", "tier", "maxUses", "used"})
	for _, c := range codes {
		_ = cw.Write([]string{c.Code, strconv.Itoa(c.Tier), strconv.Itoa(c.MaxUses), strconv.Itoa(c.Used)})
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("access.WriteCodes: %w", err)
	}
	return nil
}
