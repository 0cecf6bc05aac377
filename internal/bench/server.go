// Package bench drives the HTTP and WebSocket benchmarks of `make bench`:
// a server process (`flashsale-bench server`) that serves the bare fiber
// baseline, the bare coder/websocket baseline or a whole gateway on local
// redis-server and PostgreSQL, and two drivers that start the servers as
// child processes and run them in interleaved rounds: `flashsale-bench
// http` runs wrk and reports requests per second as ratios to the baseline
// measured in the same run, with the Redis commands and CPU each request
// cost; `flashsale-bench ws` opens paced WebSocket joins, holds them and
// closes them, and reports the CPU of each phase against the baseline's.
//
// Nothing here is used in production: only cmd/flashsale-bench imports
// it, and TestLayout keeps it out of cmd/flashsale.
package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/gateway"
	"github.com/flashsale/flashsale/internal/adapter/postgres"
	"github.com/flashsale/flashsale/internal/harness/localsvc"
	"github.com/flashsale/flashsale/internal/wiring"
)

// Server modes.
const (
	ModeBaseline = "baseline" // bare fiber handler answering 410
	ModeGateway  = "gateway"  // the gateway role of wiring.Start on local Redis and PostgreSQL
	ModeWSBare   = "ws-bare"  // bare coder/websocket server answering a join (wsBare)
)

// ServerOptions configure Serve.
type ServerOptions struct {
	Mode      string
	Addr      string // public listener; "127.0.0.1:0" picks a port
	Dir       string // scratch directory for redis-server and PostgreSQL (gateway); "" = a temporary one
	JWTSecret string // gateway: the access-token secret the driver mints with
	// QueueSale (gateway): also create a sale in queue order opening in
	// six hours, whose WebSocket joins wait in its pre-queue (RunWS).
	QueueSale bool
}

// ServerInfo is what a ready server prints as one JSON line on stdout.
type ServerInfo struct {
	Mode     string `json:"mode"`
	PID      int    `json:"pid"`
	URL      string `json:"url"`
	AdminURL string `json:"adminUrl,omitempty"`
	RedisURL string `json:"redisUrl,omitempty"`
	// The benchmark sale: open, one item of quantity 1 (to be sold out by
	// the driver) and one of a quantity that does not run out.
	SaleID      int64 `json:"saleId,omitempty"`
	SoldOutItem int64 `json:"soldOutItem,omitempty"`
	InStockItem int64 `json:"inStockItem,omitempty"`
	// QueueSaleID is the pre-queue's sale (ServerOptions.QueueSale).
	QueueSaleID int64 `json:"queueSaleId,omitempty"`
}

// InStockQuantity is the stock of the in-stock item.
const InStockQuantity = 100_000_000

// Permissive lifts the per-address and per-user limits: every request of a
// benchmark comes from 127.0.0.1.
const Permissive = `{"rateLimit": {"perIp": {"rps": 1000000, "burst": 1000000}, "perUser": {"rps": 1000000, "burst": 1000000}},
	"pow": {"difficulty": 0}, "blocklist": {"cidrs": [], "users": []}}`

// RateLimited allows one purchase request per second per address.
const RateLimited = `{"rateLimit": {"perIp": {"rps": 1, "burst": 1}, "perUser": {"rps": 1000000, "burst": 1000000}},
	"pow": {"difficulty": 0}, "blocklist": {"cidrs": [], "users": []}}`

// Serve runs a benchmark server until ctx ends or in reaches EOF (the
// driver went away). In gateway mode it reads commands from in, one a line,
// and answers each with one line on out ("ok" or "error: ..."):
//
//	defense <settings JSON on one line>   wiring.SetDefense
func Serve(ctx context.Context, o ServerOptions, in io.Reader, out io.Writer, log *slog.Logger) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		return err
	}
	lines := make(chan string)
	go func() { // EOF on stdin ends the server
		defer cancel()
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
	}()
	info := ServerInfo{Mode: o.Mode, PID: os.Getpid(), URL: "http://" + ln.Addr().String()}
	switch o.Mode {
	case ModeBaseline:
		return serveBaseline(ctx, cancel, gateway.ServeBaseline, ln, info, lines, out)
	case ModeWSBare:
		return serveBaseline(ctx, cancel, serveWSBaseline, ln, info, lines, out)
	case ModeGateway:
		ln.Close() // wiring.Start listens itself, on the same address
		return serveGateway(ctx, o, ln.Addr().String(), info, lines, out, log)
	default:
		ln.Close()
		return fmt.Errorf("bench: unknown mode %q (want %s, %s or %s)", o.Mode, ModeBaseline, ModeGateway, ModeWSBare)
	}
}

// serveBaseline runs a baseline server (serve) on ln until it returns,
// which ctx's end makes it do, refusing every command: a baseline takes
// none.
func serveBaseline(ctx context.Context, cancel context.CancelFunc, serve func(context.Context, net.Listener) error,
	ln net.Listener, info ServerInfo, lines <-chan string, out io.Writer) error {
	errc := make(chan error, 1)
	go func() { errc <- serve(ctx, ln) }()
	if err := json.NewEncoder(out).Encode(info); err != nil {
		cancel()
		<-errc
		return err
	}
	for {
		select {
		case err := <-errc:
			return err
		case <-lines:
			fmt.Fprintf(out, "error: a baseline server (%s) takes no commands\n", info.Mode)
		}
	}
}

func serveGateway(ctx context.Context, o ServerOptions, addr string, info ServerInfo, lines <-chan string, out io.Writer, log *slog.Logger) error {
	if o.JWTSecret == "" {
		return errors.New("bench: gateway mode needs a JWT secret")
	}
	dir := o.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "flashsale-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	rds, err := localsvc.StartRedis(ctx, localsvc.RedisOptions{Dir: filepath.Join(dir, "redis")})
	if err != nil {
		return err
	}
	defer rds.Stop()
	pg, err := localsvc.StartPostgres(ctx, localsvc.PostgresOptions{Dir: filepath.Join(dir, "pg")})
	if err != nil {
		return err
	}
	defer pg.Stop()
	pool, err := postgres.Open(ctx, postgres.Config{URL: pg.URL, MaxConns: 2})
	if err != nil {
		return err
	}
	err = postgres.Migrate(ctx, pool)
	pool.Close()
	if err != nil {
		return err
	}

	cfg := wiring.Defaults()
	cfg.HTTPAddr, cfg.AdminAddr = addr, "127.0.0.1:0"
	cfg.RedisURL, cfg.DatabaseURL = rds.URL, pg.URL
	cfg.JWTSecret = o.JWTSecret
	// In-stock runs leave many reservations pending (no writer role in
	// this process): keep the reconciler away from them during the run.
	cfg.ReconcileAfter = time.Hour
	a, err := wiring.Start(ctx, cfg, wiring.Roles{Gateway: true}, log)
	if err != nil {
		return err
	}
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer scancel()
		if err := a.Close(sctx); err != nil {
			log.Warn("close", "err", err)
		}
	}()
	if err := a.SetDefense(ctx, "bench", []byte(Permissive)); err != nil {
		return err
	}
	sale, err := a.CreateSale(ctx, flashsale.Sale{
		Name:                   "bench",
		StartsAt:               time.Now().Add(-time.Second).Truncate(time.Second),
		AdmissionRatePerSecond: 10000,
		Allocation:             flashsale.AllocationRace,
		Items: []flashsale.Item{
			{ProductID: 1, Quantity: 1, PriceCents: 1999},
			{ProductID: 2, Quantity: InStockQuantity, PriceCents: 999},
		},
	})
	if err != nil {
		return err
	}
	if o.QueueSale {
		qs, err := a.CreateSale(ctx, flashsale.Sale{
			Name:                   "bench-queue",
			StartsAt:               time.Now().Add(6 * time.Hour).Truncate(time.Second),
			AdmissionRatePerSecond: 10000,
			Allocation:             flashsale.AllocationQueue,
			Items:                  []flashsale.Item{{ProductID: 3, Quantity: 10_000, PriceCents: 999}},
		})
		if err != nil {
			return err
		}
		info.QueueSaleID = qs.ID
	}
	info.URL, info.AdminURL, info.RedisURL = a.PublicURL, a.AdminURL, rds.URL
	info.SaleID, info.SoldOutItem, info.InStockItem = sale.ID, sale.Items[0].ID, sale.Items[1].ID
	if err := json.NewEncoder(out).Encode(info); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-a.Done():
			return a.Err()
		case line := <-lines:
			cmd, arg, _ := strings.Cut(line, " ")
			switch cmd {
			case "defense":
				if err := a.SetDefense(ctx, "bench", []byte(arg)); err != nil {
					fmt.Fprintf(out, "error: %v\n", err)
					continue
				}
				fmt.Fprintln(out, "ok")
			default:
				fmt.Fprintf(out, "error: unknown command %q\n", cmd)
			}
		}
	}
}
