package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/flashsale/flashsale/internal/adapter/postgres"
	"github.com/flashsale/flashsale/internal/adapter/redisconn"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/internal/wiring"
	"github.com/flashsale/flashsale/sales"
	"github.com/flashsale/flashsale/waitroom"
)

func cmdVerifyDraw(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := wiring.Defaults()
	if err := cfg.LoadEnv(); err != nil {
		return err
	}
	fs := newFlagSet("verify-draw", stderr)
	saleID := fs.Int64("sale", 0, "sale id")
	var rf remoteDrawFlags
	fs.StringVar(&rf.url, "url", "", "the public draw record (https://host/api/flash-sales/sales/ID/draw), or a gateway's base URL with --sale; no Redis or database access")
	fs.Int64Var(&rf.user, "user", 0, "with --url and --secret: also print this user's ticket and place")
	fs.StringVar(&rf.secret, "secret", "", "with --user: the user's drawSecret from the join status (32 hex characters)")
	fs.StringVar(&rf.commitment, "commitment", "", "with --url: the commitment you noted before opening (hex)")
	fs.BoolVar(&rf.list, "list", false, "with --url: print every place and its ticket")
	redisFlags(fs, &cfg)
	cfg.RegisterFlags(fs, "FLASHSALE_DATABASE_URL")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if rf.url != "" {
		rf.sale = *saleID
		return verifyRemoteDraw(ctx, rf, stdout)
	}
	if *saleID <= 0 {
		return fmt.Errorf("--sale must be a sale id")
	}
	if cfg.DatabaseURL == "" {
		return fmt.Errorf("FLASHSALE_DATABASE_URL must be set")
	}
	rdb, err := redisconn.Open(ctx, cfg.Redis())
	if err != nil {
		return err
	}
	defer rdb.Close()
	pool, err := postgres.Open(ctx, postgres.Config{URL: cfg.DatabaseURL, MaxConns: 2})
	if err != nil {
		return err
	}
	defer pool.Close()
	sale, err := sales.NewStore(pool, rdb, redisstock.New(rdb), nil).Get(ctx, *saleID)
	if err != nil {
		return err
	}
	// The seed is revealed when the pre-queue closes, FLASHSALE_DRAW_LEAD
	// before the opening, after the last join that counts.
	if closes := waitroom.DrawAt(&sale, cfg.DrawLead); time.Now().Before(closes) {
		fmt.Fprintf(stdout, "sale %d opens at %s; its pre-queue closes at %s and its seed is secret until then (commitment %s)\n",
			sale.ID, sale.StartsAt.Format(time.RFC3339), closes.Format(time.RFC3339Nano), sale.ShuffleCommitment)
		return nil
	}
	rep, err := waitroom.VerifyDraw(ctx, rdb, &sale)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "sale %d\n  seed        %s\n  commitment  %s (sha256 of seed matches: %v)\n  pre-queue   %d shoppers, drawn: %v\n  checked     %d admissions\n",
		rep.SaleID, rep.SeedHex, rep.Commitment, rep.CommitmentOK, len(rep.PreQueue), rep.Drawn, rep.Checked)
	if rep.Tiered {
		fmt.Fprintf(stdout, "  by tier     %s\n", tierSummary(rep.Tiers))
	}
	for _, m := range rep.Mismatches {
		fmt.Fprintf(stdout, "  MISMATCH    %s\n", m)
	}
	if !rep.OK {
		return fmt.Errorf("the published draw does not match")
	}
	fmt.Fprintln(stdout, "  OK: the published order matches the draw recomputed from the seed")
	return nil
}
