package writer

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/postgres"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/internal/harness/localsvc"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/sales"
)

const benchOrders = 10_000

// BenchmarkWriter10k measures 10,000 orders already reserved in Redis going
// from Kafka to committed rows (database commit, Redis confirm, offset
// commit), with the writer's defaults (batch 500, 10 items, 4 partitions).
//
//   - fsync-off: the test cluster (fsync=off, synchronous_commit=off).
//   - fsync-off-synccommit-on: the same cluster, synchronous_commit=on for
//     the writer's session (fsync stays off, so this only adds the WAL write
//     wait, not a disk flush).
//   - durable: a cluster of its own with fsync=on, synchronous_commit=on (the
//     production settings; the disk of this machine decides the number).
func BenchmarkWriter10k(b *testing.B) {
	b.Run("fsync-off", func(b *testing.B) { benchWriter(b, testenv.DatabaseURL(b), nil) })
	b.Run("fsync-off-synccommit-on", func(b *testing.B) {
		benchWriter(b, testenv.DatabaseURL(b), map[string]string{"synchronous_commit": "on"})
	})
	b.Run("durable", func(b *testing.B) { benchWriter(b, durableDatabase(b), nil) })
}

// durableDatabase starts a PostgreSQL cluster with fsync on for this
// benchmark and returns the URL of a migrated database.
func durableDatabase(b *testing.B) string {
	b.Helper()
	dir, err := os.MkdirTemp("", "flashsale-bench-pg-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	ctx := context.Background()
	pg, err := localsvc.StartPostgres(ctx, localsvc.PostgresOptions{Dir: filepath.Join(dir, "pg")})
	if err != nil {
		b.Skipf("durable PostgreSQL: %v", err)
	}
	b.Cleanup(func() { pg.Stop() })
	pool, err := pgxpool.New(ctx, pg.URL)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool); err != nil {
		b.Fatal(err)
	}
	return pg.URL
}

func benchPool(b *testing.B, url string, params map[string]string, maxConns int32) *pgxpool.Pool {
	b.Helper()
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	pc.MaxConns = maxConns
	for k, v := range params {
		pc.ConnConfig.RuntimeParams[k] = v
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}

func benchWriter(b *testing.B, url string, params map[string]string) {
	ctx := context.Background()
	pool := benchPool(b, url, params, 4) // Config.MaxConns default
	rdb := testenv.Redis(b)
	st := redisstock.New(rdb)
	ss := sales.NewStore(pool, rdb, st, nil)
	var elapsed time.Duration
	b.StopTimer()
	for i := 0; i < b.N; i++ {
		k := testenv.NewKafka(b)
		prod, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.ProducerBatchMaxBytes(1<<20))
		if err != nil {
			b.Fatal(err)
		}
		in := flashsale.Sale{Name: "bench", StartsAt: time.Now(), AdmissionRatePerSecond: 1000}
		for j := range 10 {
			in.Items = append(in.Items, flashsale.Item{ProductID: int64(j), Quantity: benchOrders / 10, PriceCents: 100})
		}
		sale, err := ss.Create(ctx, in)
		if err != nil {
			b.Fatal(err)
		}
		recs := reserveAll(b, st, sale, benchOrders)

		w, err := New(Config{Brokers: k.Brokers}, pool, st, testLogger(b), nil)
		if err != nil {
			b.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- w.Run(rctx) }()
		// Warm up: the group is joined once the writer handled one record.
		if err := prod.ProduceSync(ctx, &kgo.Record{Topic: flashsale.TopicOrders, Value: []byte("warm-up")}).FirstErr(); err != nil {
			b.Fatal(err)
		}
		waitHandled(b, w, 1)

		start := time.Now()
		b.StartTimer()
		if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			b.Fatal(err)
		}
		waitHandled(b, w, benchOrders+1)
		b.StopTimer()
		elapsed += time.Since(start)

		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		w.Close()
		prod.Close()
		var rows, soldSum int
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM orders WHERE sale_id = $1), (SELECT sum(sold) FROM items WHERE sale_id = $1)`, sale.ID).Scan(&rows, &soldSum); err != nil {
			b.Fatal(err)
		}
		if rows != benchOrders || soldSum != benchOrders || w.counts().written != benchOrders {
			b.Fatalf("rows %d, sold %d, counts %+v; want %d each", rows, soldSum, w.counts(), benchOrders)
		}
	}
	b.ReportMetric(float64(benchOrders*b.N)/elapsed.Seconds(), "orders/s")
	b.ReportMetric(0, "ns/op")
}

// reserveAll reserves n units spread over the sale's items, as the purchase
// service would, and returns the records it would publish.
func reserveAll(b *testing.B, st *redisstock.Store, sale flashsale.Sale, n int) []*kgo.Record {
	b.Helper()
	recs := make([]*kgo.Record, n)
	var wg sync.WaitGroup
	const workers = 16
	errs := make(chan error, workers)
	now := time.Now()
	base := time.Now().UnixNano() % 1e12
	for g := range workers {
		wg.Go(func() {
			for i := g; i < n; i += workers {
				it := sale.Items[i%len(sale.Items)]
				m := flashsale.OrderPlaced{OrderID: uuid.NewString(), SaleID: sale.ID, ItemID: it.ID,
					UserID: base + int64(i), PriceCents: it.PriceCents, CreatedAtMs: now.UnixMilli()}
				if err := st.Reserve(context.Background(), sale.ID, it.ID, m.UserID, m.OrderID, now); err != nil {
					errs <- err
					return
				}
				v, _ := json.Marshal(m)
				recs[i] = &kgo.Record{Topic: flashsale.TopicOrders, Key: []byte(strconv.FormatInt(it.ID, 10)), Value: v}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	return recs
}

// BenchmarkRawBatchedInsert is the baseline: the same 10,000 rows written by
// bare pgx, one transaction per 500 rows (multi-row insert + one guarded
// update), no Kafka, no Redis.
//
//   - unnest: INSERT ... SELECT FROM unnest($arrays) (what the writer does).
//   - copy-temp: COPY into a temp table, then INSERT ... SELECT from it.
func BenchmarkRawBatchedInsert(b *testing.B) {
	b.Run("unnest", func(b *testing.B) { benchRaw(b, false) })
	b.Run("copy-temp", func(b *testing.B) { benchRaw(b, true) })
}

func benchRaw(b *testing.B, viaCopy bool) {
	ctx := context.Background()
	pool := benchPool(b, testenv.DatabaseURL(b), nil, 1)
	const batch = 500
	var elapsed time.Duration
	b.StopTimer()
	for i := 0; i < b.N; i++ {
		var saleID, itemID int64
		if err := pool.QueryRow(ctx, `INSERT INTO sales (name, starts_at, admission_rate, shuffle_seed, shuffle_commitment)
			VALUES ('raw', now(), 1, '\x00', '') RETURNING id`).Scan(&saleID); err != nil {
			b.Fatal(err)
		}
		if err := pool.QueryRow(ctx, `INSERT INTO items (sale_id, product_id, quantity, price_cents) VALUES ($1, 1, $2, 100) RETURNING id`,
			saleID, benchOrders).Scan(&itemID); err != nil {
			b.Fatal(err)
		}
		now := time.Now()
		start := time.Now()
		b.StartTimer()
		for off := 0; off < benchOrders; off += batch {
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				ids := make([]uuid.UUID, batch)
				users := make([]int64, batch)
				for j := range ids {
					ids[j], users[j] = uuid.New(), int64(off+j+1)
				}
				var tag int64
				if viaCopy {
					if _, err := tx.Exec(ctx, `CREATE TEMP TABLE IF NOT EXISTS raw_in (id uuid, user_id int8) ON COMMIT DELETE ROWS`); err != nil {
						return err
					}
					if _, err := tx.CopyFrom(ctx, pgx.Identifier{"raw_in"}, []string{"id", "user_id"},
						pgx.CopyFromSlice(batch, func(j int) ([]any, error) { return []any{ids[j], users[j]}, nil })); err != nil {
						return err
					}
					ct, err := tx.Exec(ctx, `INSERT INTO orders (id, sale_id, item_id, user_id, status, price_cents, created_at, expires_at)
						SELECT id, $1, $2, user_id, 'PENDING', 100, $3, $4 FROM raw_in ON CONFLICT (id) DO NOTHING`,
						saleID, itemID, now, now.Add(10*time.Minute))
					if err != nil {
						return err
					}
					tag = ct.RowsAffected()
				} else {
					ct, err := tx.Exec(ctx, `INSERT INTO orders (id, sale_id, item_id, user_id, status, price_cents, created_at, expires_at)
						SELECT u.id, $3, $4, u.user_id, 'PENDING', 100, $5, $6 FROM unnest($1::uuid[], $2::int8[]) AS u(id, user_id)
						ON CONFLICT (id) DO NOTHING`, ids, users, saleID, itemID, now, now.Add(10*time.Minute))
					if err != nil {
						return err
					}
					tag = ct.RowsAffected()
				}
				ct, err := tx.Exec(ctx, `UPDATE items SET sold = sold + $2 WHERE id = $1 AND sold + $2 <= quantity`, itemID, tag)
				if err != nil {
					return err
				}
				if ct.RowsAffected() != 1 {
					return fmt.Errorf("guarded update refused")
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		elapsed += time.Since(start)
	}
	b.ReportMetric(float64(benchOrders*b.N)/elapsed.Seconds(), "orders/s")
	b.ReportMetric(0, "ns/op")
}
