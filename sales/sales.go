// Package sales stores sales in PostgreSQL, loads their stock into Redis and
// keeps the in-memory sale cache that every gateway reads on its hot paths.
package sales

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/postgres"
	"github.com/flashsale/flashsale/internal/adapter/postgres/orderstore"
	"github.com/flashsale/flashsale/internal/adapter/redisstock"
	"github.com/flashsale/flashsale/lua"
)

// Store is the sale repository.
type Store struct {
	pool   *pgxpool.Pool
	orders *orderstore.Store // the orders' figures
	rdb    redis.UniversalClient
	stock  *redisstock.Store
	now    func() time.Time
}

// NewStore returns a Store. now may be nil (time.Now).
func NewStore(pool *pgxpool.Pool, rdb redis.UniversalClient, st *redisstock.Store, now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{pool: pool, orders: orderstore.New(pool), rdb: rdb, stock: st, now: now}
}

var errNotFound = &flashsale.Error{Code: flashsale.CodeNotFound, Message: "no such sale"}

// Commitment returns the hex SHA-256 of the seed bytes.
func Commitment(seed []byte) string {
	sum := sha256.Sum256(seed)
	return hex.EncodeToString(sum[:])
}

// Create stores a new sale with a fresh shuffle seed and its commitment,
// assigns ids, loads the stock into Redis and announces the sale. The caller
// validates the input.
func (s *Store) Create(ctx context.Context, in flashsale.Sale) (_ flashsale.Sale, err error) {
	defer postgres.MarkOutage(&err) // an outage answers UNAVAILABLE
	seed := make([]byte, 32)
	if _, err := rand.Read(seed); err != nil {
		return flashsale.Sale{}, fmt.Errorf("sales.Create: %w", err)
	}
	out := in
	if out.Allocation == "" {
		// New sales are allocated in queue order unless race is named.
		out.Allocation = flashsale.AllocationQueue
	}
	out.ClaimWindow = out.Window()
	out.ShuffleSeed = seed
	out.ShuffleCommitment = Commitment(seed)
	out.Items = make([]flashsale.Item, len(in.Items))
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var ends *time.Time
		if !in.EndsAt.IsZero() {
			ends = &in.EndsAt
		}
		if err := tx.QueryRow(ctx, `INSERT INTO sales (name, starts_at, ends_at, admission_rate, shuffle_seed, shuffle_commitment, stock_shards,
				allocation, claim_window_seconds, access)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING id, created_at, version`,
			in.Name, in.StartsAt, ends, in.AdmissionRatePerSecond, seed, out.ShuffleCommitment, in.Shards(),
			out.Allocation, int(out.ClaimWindow/time.Second), accessColumn(in.Access)).Scan(&out.ID, &out.CreatedAt, &out.Version); err != nil {
			return err
		}
		for i, it := range in.Items {
			it = it.WithDefaults()
			it.SaleID = out.ID
			if err := tx.QueryRow(ctx, `INSERT INTO items (sale_id, product_id, quantity, price_cents, name, image_url, currency)
				VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id`,
				out.ID, it.ProductID, it.Quantity, it.PriceCents, it.Name, it.ImageURL, it.Currency).Scan(&it.ID); err != nil {
				return err
			}
			out.Items[i] = it
		}
		body := map[string]any{
			"saleId": out.ID, "name": out.Name, "startsAt": out.StartsAt, "admissionRatePerSecond": out.AdmissionRatePerSecond,
			"shuffleCommitment": out.ShuffleCommitment, "items": len(out.Items), "stockShards": out.Shards(),
			"allocation": out.Allocation, "claimWindowSeconds": int(out.ClaimWindow / time.Second),
		}
		if !out.Access.Plain() {
			body["access"] = out.Access
		}
		return audit(ctx, tx, in.CreatedBy, "sale.create", body)
	})
	if err != nil {
		return flashsale.Sale{}, fmt.Errorf("sales.Create: %w", err)
	}
	out.StockShards = out.Shards()
	remaining := make(map[int64]int64, len(out.Items))
	for _, it := range out.Items {
		remaining[it.ID] = it.Quantity
	}
	s.stock.SetShards(out.ID, out.StockShards)
	if err := s.stock.Load(ctx, out.ID, remaining); err != nil {
		return flashsale.Sale{}, fmt.Errorf("sales.Create: %w", err)
	}
	s.announce(ctx, out.ID)
	return out, nil
}

func (s *Store) announce(ctx context.Context, id int64) {
	// Best effort: caches also refresh on a timer.
	_ = s.rdb.Publish(ctx, lua.SalesChannel, id).Err()
}

const saleColumns = `id, name, starts_at, coalesce(ends_at, 'epoch'::timestamptz), admission_rate, shuffle_seed, shuffle_commitment, created_at, stock_shards,
	version, paused, message_text, coalesce(message_at, 'epoch'::timestamptz), allocation, claim_window_seconds, access`

// scanSale reads a sale's row and tells the stock store its shard count.
func (s *Store) scanSale(row pgx.Row) (flashsale.Sale, error) {
	var sl flashsale.Sale
	var window int
	var access []byte
	err := row.Scan(&sl.ID, &sl.Name, &sl.StartsAt, &sl.EndsAt, &sl.AdmissionRatePerSecond, &sl.ShuffleSeed, &sl.ShuffleCommitment, &sl.CreatedAt, &sl.StockShards,
		&sl.Version, &sl.Paused, &sl.Message, &sl.MessageAt, &sl.Allocation, &window, &access)
	sl.ClaimWindow = time.Duration(window) * time.Second
	if err == nil {
		sl.Access, err = readAccess(access)
	}
	if err == nil {
		s.stock.SetShards(sl.ID, sl.StockShards)
	}
	if sl.EndsAt.Unix() == 0 {
		sl.EndsAt = time.Time{}
	}
	if sl.MessageAt.Unix() == 0 || sl.Message == "" {
		sl.MessageAt = time.Time{}
	} else {
		sl.MessageAt = sl.MessageAt.UTC()
	}
	sl.StartsAt = sl.StartsAt.UTC()
	sl.CreatedAt = sl.CreatedAt.UTC()
	return sl, err
}

// Get returns one sale with its items, or NOT_FOUND.
func (s *Store) Get(ctx context.Context, id int64) (_ flashsale.Sale, err error) {
	defer postgres.MarkOutage(&err) // an outage answers UNAVAILABLE
	sl, err := s.scanSale(s.pool.QueryRow(ctx, `SELECT `+saleColumns+` FROM sales WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return flashsale.Sale{}, errNotFound
	}
	if err != nil {
		return flashsale.Sale{}, fmt.Errorf("sales.Get: %w", err)
	}
	items, err := s.items(ctx, `WHERE sale_id = $1`, id)
	if err != nil {
		return flashsale.Sale{}, fmt.Errorf("sales.Get: %w", err)
	}
	sl.Items = items[id]
	return sl, nil
}

func (s *Store) items(ctx context.Context, where string, args ...any) (map[int64][]flashsale.Item, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, sale_id, product_id, quantity, price_cents, name, image_url, currency FROM items `+where+` ORDER BY id`, args...)
	if err != nil {
		return nil, err
	}
	out := map[int64][]flashsale.Item{}
	for rows.Next() {
		var it flashsale.Item
		if err := rows.Scan(&it.ID, &it.SaleID, &it.ProductID, &it.Quantity, &it.PriceCents, &it.Name, &it.ImageURL, &it.Currency); err != nil {
			return nil, err
		}
		out[it.SaleID] = append(out[it.SaleID], it)
	}
	return out, rows.Err()
}

// List returns every sale with its items, newest first.
func (s *Store) List(ctx context.Context) (_ []flashsale.Sale, err error) {
	defer postgres.MarkOutage(&err) // an outage answers UNAVAILABLE
	rows, err := s.pool.Query(ctx, `SELECT `+saleColumns+` FROM sales ORDER BY id DESC`)
	if err != nil {
		return nil, fmt.Errorf("sales.List: %w", err)
	}
	var out []flashsale.Sale
	for rows.Next() {
		sl, err := s.scanSale(rows)
		if err != nil {
			return nil, fmt.Errorf("sales.List: %w", err)
		}
		out = append(out, sl)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sales.List: %w", err)
	}
	items, err := s.items(ctx, ``)
	if err != nil {
		return nil, fmt.Errorf("sales.List: %w", err)
	}
	for i := range out {
		out[i].Items = items[out[i].ID]
	}
	return out, nil
}

// Update applies a live change and announces it. With u.IfVersion set, it
// applies only while the sale is at that version: VERSION_CONFLICT (nothing
// changed) otherwise.
func (s *Store) Update(ctx context.Context, id int64, u flashsale.SaleUpdate) (_ flashsale.Sale, err error) {
	defer postgres.MarkOutage(&err) // an outage answers UNAVAILABLE
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		version, err := s.lockVersion(ctx, tx, id, u.IfVersion)
		if err != nil {
			return err
		}
		// Guarded by the version read under the row lock: the check and
		// the write are one step.
		tag, err := tx.Exec(ctx, `UPDATE sales SET
			name = coalesce($3, name),
			admission_rate = coalesce($4, admission_rate),
			ends_at = coalesce($5, ends_at),
			access = coalesce($6, access),
			version = version + 1,
			updated_at = now()
			WHERE id = $1 AND version = $2`, id, version, u.Name, u.AdmissionRatePerSecond, u.EndsAt, updateAccess(u.Access))
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return errConflict
		}
		change := map[string]any{"saleId": id}
		if u.Name != nil {
			change["name"] = *u.Name
		}
		if u.AdmissionRatePerSecond != nil {
			change["admissionRatePerSecond"] = *u.AdmissionRatePerSecond
		}
		if u.EndsAt != nil {
			change["endsAt"] = *u.EndsAt
		}
		if u.Access != nil {
			change["access"] = *u.Access
		}
		return audit(ctx, tx, u.Actor, "sale.update", change)
	})
	if code := flashsale.ErrorCode(err); code == flashsale.CodeNotFound || code == flashsale.CodeVersionConflict {
		return flashsale.Sale{}, err
	}
	if err != nil {
		return flashsale.Sale{}, fmt.Errorf("sales.Update: %w", err)
	}
	s.announce(ctx, id)
	return s.Get(ctx, id)
}

// accessColumn is the sales.access value of a rule: {} for the plain
// open rule, the API's access object otherwise.
func accessColumn(a flashsale.SaleAccess) []byte {
	if a.Plain() {
		return []byte(`{}`)
	}
	b, err := a.MarshalJSON()
	if err != nil { // a SaleAccess always marshals
		return []byte(`{}`)
	}
	return b
}

// updateAccess is the update's access column value, nil to keep it.
func updateAccess(a *flashsale.SaleAccess) []byte {
	if a == nil {
		return nil
	}
	return accessColumn(*a)
}

// readAccess reads sales.access: {} is the plain open rule.
func readAccess(b []byte) (flashsale.SaleAccess, error) {
	if len(b) == 0 || string(b) == "{}" {
		return flashsale.SaleAccess{}, nil
	}
	a, err := flashsale.ParseAccess(b)
	if err != nil {
		return flashsale.SaleAccess{}, fmt.Errorf("sales: stored access rule: %w", err)
	}
	return a, nil
}

var errConflict = &flashsale.Error{Code: flashsale.CodeVersionConflict,
	Message: "the sale was changed by someone else since you read it; nothing changed (the current sale is in \"current\")"}

// lockVersion locks the sale's row for the transaction and returns its
// version: NOT_FOUND for no sale, VERSION_CONFLICT when ifVersion (not 0)
// is not it.
//
// The lock is FOR NO KEY UPDATE, as are the item locks of Act: the order
// writer's inserts hold KEY SHARE locks on their sale and item rows (the
// foreign keys), which FOR UPDATE would wait for, and the writer locks the
// item before the sale, so an operator's action during a sale could
// deadlock with it. No change here touches a key.
func (s *Store) lockVersion(ctx context.Context, tx pgx.Tx, id, ifVersion int64) (int64, error) {
	var version int64
	err := tx.QueryRow(ctx, `SELECT version FROM sales WHERE id = $1 FOR NO KEY UPDATE`, id).Scan(&version)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, errNotFound
	}
	if err != nil {
		return 0, err
	}
	if ifVersion != 0 && ifVersion != version {
		return 0, errConflict
	}
	return version, nil
}

// OrderReport is the orders' part of the sale's report (the order store
// reads it from the orders).
func (s *Store) OrderReport(ctx context.Context, saleID int64) (_ flashsale.OrderReport, err error) {
	defer postgres.MarkOutage(&err) // an outage answers UNAVAILABLE
	return s.orders.OrderReport(ctx, saleID)
}

// Figures returns the live figures of a sale's items: remaining from Redis
// (over every stock shard), the order counts by status from PostgreSQL.
func (s *Store) Figures(ctx context.Context, saleID int64) (_ []flashsale.ItemFigures, err error) {
	defer postgres.MarkOutage(&err) // an outage answers UNAVAILABLE
	sl, err := s.Get(ctx, saleID)
	if err != nil {
		return nil, err
	}
	remaining, err := s.stock.Remaining(ctx, saleID)
	if err != nil {
		return nil, fmt.Errorf("sales.Figures: %w", err)
	}
	byItem := make(map[int64]*flashsale.ItemFigures, len(sl.Items))
	out := make([]flashsale.ItemFigures, len(sl.Items))
	for i, it := range sl.Items {
		out[i] = flashsale.ItemFigures{ItemID: it.ID, Remaining: remaining[it.ID]}
		byItem[it.ID] = &out[i]
	}
	counts, err := s.orders.CountBySale(ctx, saleID)
	if err != nil {
		return nil, fmt.Errorf("sales.Figures: %w", err)
	}
	for item, byStatus := range counts {
		f := byItem[item]
		if f == nil {
			continue
		}
		for status, n := range byStatus {
			if status.Live() { // a live order holds a unit: sold
				f.Sold += n
			}
			switch status {
			case flashsale.OrderPaid:
				f.Paid += n
			case flashsale.OrderExpired:
				f.Expired += n
			case flashsale.OrderCancelled:
				f.Cancelled += n
			case flashsale.OrderRejected:
				f.Rejected += n
			}
		}
	}
	return out, nil
}

// audit records an operator action in the audit log (the table the
// bot-defense settings changes are logged in too).
func audit(ctx context.Context, tx pgx.Tx, actor, action string, body map[string]any) error {
	if actor == "" {
		actor = "system"
	}
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO audit_log (actor, action, body) VALUES ($1, $2, $3)`, actor, action, b)
	return err
}
