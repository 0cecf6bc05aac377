package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/flashsale/flashsale/waitroom"
)

// maxDrawRecord bounds the record verify-draw reads: far above the record
// of any queue the room serves (docs/DRAW.md has the size per member).
const maxDrawRecord = 1 << 30

type remoteDrawFlags struct {
	url        string
	sale       int64
	user       int64
	secret     string
	commitment string
	list       bool
}

// drawURLs returns the record's URL and the sale page's, from a record URL
// (…/sales/ID/draw) or a base URL and a sale id.
func drawURLs(raw string, sale int64) (record, salePage string, id int64, err error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", "", 0, fmt.Errorf("--url must be an http(s) URL")
	}
	u.RawQuery, u.Fragment = "", ""
	path := strings.TrimRight(u.Path, "/")
	if rest, ok := strings.CutSuffix(path, "/draw"); ok {
		i := strings.LastIndex(rest, "/sales/")
		if i < 0 {
			return "", "", 0, fmt.Errorf("--url: %s is not a draw record URL (…/sales/ID/draw)", raw)
		}
		id, err = strconv.ParseInt(rest[i+len("/sales/"):], 10, 64)
		if err != nil || id <= 0 {
			return "", "", 0, fmt.Errorf("--url: %s is not a draw record URL (…/sales/ID/draw)", raw)
		}
		if sale != 0 && sale != id {
			return "", "", 0, fmt.Errorf("--sale %d but --url names sale %d", sale, id)
		}
		u.Path = path
		rec := u.String()
		u.Path = rest
		return rec, u.String(), id, nil
	}
	if sale <= 0 {
		return "", "", 0, fmt.Errorf("--url without …/sales/ID/draw needs --sale")
	}
	base := path + "/api/flash-sales/sales/" + strconv.FormatInt(sale, 10)
	u.Path = base + "/draw"
	rec := u.String()
	u.Path = base
	return rec, u.String(), sale, nil
}

// verifyRemoteDraw fetches a public draw record and the sale page, checks
// the seed against the commitment (the record's, the page's and
// --commitment) and recomputes every place. Any disagreement is an error.
func verifyRemoteDraw(ctx context.Context, f remoteDrawFlags, stdout io.Writer) error {
	recURL, pageURL, saleID, err := drawURLs(f.url, f.sale)
	if err != nil {
		return err
	}
	var secret [waitroom.MemberSecretBytes]byte
	if f.user != 0 || f.secret != "" {
		if f.user <= 0 || f.secret == "" {
			return errors.New("--user and --secret go together: a member tag is derived from both")
		}
		if secret, err = waitroom.ParseMemberSecret(f.secret); err != nil {
			return fmt.Errorf("--secret: %w", err)
		}
	}
	client := &http.Client{Timeout: 2 * time.Minute}
	var page struct {
		ShuffleCommitment string `json:"shuffleCommitment"`
	}
	if err := getJSON(ctx, client, pageURL, func(r io.Reader) error {
		return json.NewDecoder(io.LimitReader(r, 1<<20)).Decode(&page)
	}); err != nil {
		return err
	}
	var rec waitroom.DrawRecord
	if err := getJSON(ctx, client, recURL, func(r io.Reader) error {
		rec, err = waitroom.ParseDrawRecord(r, maxDrawRecord)
		return err
	}); err != nil {
		return err
	}
	if rec.SaleID != saleID {
		return fmt.Errorf("the record is of sale %d, not %d", rec.SaleID, saleID)
	}
	fmt.Fprintf(stdout, "sale %d\n  seed        %s\n  commitment  %s\n  pre-queue   %d tickets\n", rec.SaleID, rec.Seed, rec.Commitment, rec.PreQueueSize)
	var mismatches []string
	if !strings.EqualFold(page.ShuffleCommitment, rec.Commitment) {
		mismatches = append(mismatches, fmt.Sprintf("the sale page publishes commitment %q", page.ShuffleCommitment))
	}
	if f.commitment != "" && !strings.EqualFold(strings.TrimSpace(f.commitment), rec.Commitment) {
		mismatches = append(mismatches, fmt.Sprintf("--commitment %s differs from the record's", f.commitment))
	}
	chk, err := waitroom.CheckDrawRecord(rec)
	if err != nil {
		mismatches = append(mismatches, err.Error())
	}
	for _, m := range mismatches {
		fmt.Fprintf(stdout, "  MISMATCH    %s\n", m)
	}
	if len(mismatches) > 0 {
		return errors.New("the published draw does not match")
	}
	fmt.Fprintf(stdout, "  OK: the seed matches the commitment; %d places recomputed from it, one per ticket\n", len(chk.Order))
	if rec.Tiers != "" {
		fmt.Fprintf(stdout, "  by tier     %s\n", tierSummary(rec.Tiers))
	}
	if f.list {
		for place, ticket := range chk.Order {
			m := rec.Members[ticket]
			if m == "" {
				m = "-"
			}
			fmt.Fprintf(stdout, "  place %d ticket %d member %s%s\n", place, ticket, m, tierNote(rec, ticket))
		}
	}
	if f.user != 0 {
		ticket, ok := rec.FindMember(f.user, secret)
		if !ok {
			return fmt.Errorf("user %d with this secret holds no pre-queue ticket in this draw", f.user)
		}
		fmt.Fprintf(stdout, "  user %d     ticket %d, place %d (0-based; member %s%s)\n", f.user, ticket, chk.Places[ticket], rec.Members[ticket], tierNote(rec, ticket))
	}
	return nil
}

// tierNote is " tier t" (or " no tier") for a ticket of a draw by tier,
// "" otherwise.
func tierNote(rec waitroom.DrawRecord, ticket int64) string {
	if rec.Tiers == "" {
		return ""
	}
	if t := waitroom.TierOf(rec.Tiers[ticket]); t != 0 {
		return fmt.Sprintf(" tier %d", t)
	}
	return " no tier"
}

// tierSummary is a draw by tier's blocks of places, in drawn order:
// "tier 1: 40 places 0-39, no tier: 60 places 40-99".
func tierSummary(tiers string) string {
	var parts []string
	for _, b := range waitroom.TierBlocks(tiers) {
		name := fmt.Sprintf("tier %d", b.Tier)
		if b.Tier == 0 {
			name = "no tier"
		}
		parts = append(parts, fmt.Sprintf("%s: %d places %d-%d", name, b.Count, b.First, b.First+b.Count-1))
	}
	return strings.Join(parts, ", ")
}

// getJSON GETs u and hands a 200 body to read; any other status is an
// error carrying the contract's error code when there is one.
func getJSON(ctx context.Context, client *http.Client, u string, read func(io.Reader) error) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("verify-draw: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("verify-draw: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error   string `json:"error"`
			Message string `json:"message"`
		}
		_ = json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&e)
		if e.Error != "" {
			return fmt.Errorf("verify-draw: GET %s: %d %s: %s", u, resp.StatusCode, e.Error, e.Message)
		}
		return fmt.Errorf("verify-draw: GET %s: %s", u, resp.Status)
	}
	if err := read(resp.Body); err != nil {
		return fmt.Errorf("verify-draw: GET %s: %w", u, err)
	}
	return nil
}
