package waitroom

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flashsale/flashsale/internal/adapter/postgres"
	"github.com/flashsale/flashsale/lua"
)

// A sale's public draw record never changes after the draw, and building
// it reads the whole pre-queue and computes a tag per member. So it is
// built once, by the sale's leader right after the draw, and stored with
// its gzip form (DrawStore); gateways serve the stored bytes and no
// request does work that grows with the pre-queue.

// DrawFile is a stored draw record: its JSON body, the body gzipped, and
// the body's entity tag.
type DrawFile struct {
	// Body is the JSON record; nil when LoadDraw was asked for no body this
	// large (Size says how large it is).
	Body []byte
	Gzip []byte
	// ETag is the body's strong entity tag, quoted: the first 16 bytes of
	// its SHA-256, hex.
	ETag string
	Size int64
}

// DrawStore keeps the public draw records.
type DrawStore interface {
	// SaveDraw stores the sale's record; the first stored stays (a second
	// leader's record is the same bytes).
	SaveDraw(ctx context.Context, saleID int64, f DrawFile) error
	// DrawStored reports whether the sale's record is stored.
	DrawStored(ctx context.Context, saleID int64) (bool, error)
	// LoadDraw returns the sale's record (found false: none yet), without
	// the body when it is longer than maxBody bytes.
	LoadDraw(ctx context.Context, saleID, maxBody int64) (f DrawFile, found bool, err error)
}

// EncodeDrawRecord is the record as stored and served: JSON, its gzip
// form and its entity tag.
func EncodeDrawRecord(rec DrawRecord) (DrawFile, error) {
	body, err := json.Marshal(rec)
	if err != nil {
		return DrawFile{}, fmt.Errorf("waitroom.EncodeDrawRecord: %w", err)
	}
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed) // a valid level: no error
	if _, err := zw.Write(body); err != nil {
		return DrawFile{}, fmt.Errorf("waitroom.EncodeDrawRecord: %w", err)
	}
	if err := zw.Close(); err != nil {
		return DrawFile{}, fmt.Errorf("waitroom.EncodeDrawRecord: %w", err)
	}
	sum := sha256.Sum256(body)
	return DrawFile{Body: body, Gzip: gz.Bytes(), ETag: `"` + hex.EncodeToString(sum[:16]) + `"`, Size: int64(len(body))}, nil
}

// PublishedDraw returns the sale's stored draw record, without the body
// when it is longer than maxBody bytes. It is NOT_DRAWN until the sale's
// leader has stored it, right after the draw.
func (r *Room) PublishedDraw(ctx context.Context, saleID, maxBody int64) (_ DrawFile, err error) {
	defer postgres.MarkOutage(&err) // an outage answers UNAVAILABLE
	if r.cfg.Records == nil {
		return DrawFile{}, errNotDrawn
	}
	f, found, err := r.cfg.Records.LoadDraw(ctx, saleID, maxBody)
	if err != nil {
		return DrawFile{}, fmt.Errorf("waitroom.PublishedDraw: %w", err)
	}
	if !found {
		return DrawFile{}, errNotDrawn
	}
	return f, nil
}

// publishTimeout bounds one build and store of a record.
const publishTimeout = 30 * time.Second

// publishDraw builds and stores the sale's record once, while this gateway
// leads the sale and the pre-queue is drawn. It runs on the checkpoint
// loop (woken at the draw), never on a request or the tick.
func (r *Room) publishDraw(ctx context.Context, sr *saleRoom) error {
	sr.mu.Lock()
	due := sr.leadAt >= 0 && sr.st.N >= 0 && !sr.published
	sr.mu.Unlock()
	if !due {
		return nil
	}
	sale, ok := r.sales.Sale(sr.id)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	stored, err := r.cfg.Records.DrawStored(ctx, sr.id)
	if err != nil {
		return err
	}
	if !stored {
		rec, err := r.DrawRecord(ctx, sale)
		if err != nil {
			return err
		}
		f, err := EncodeDrawRecord(rec)
		if err != nil {
			return err
		}
		if err := r.cfg.Records.SaveDraw(ctx, sr.id, f); err != nil {
			return err
		}
		r.m.published.WithLabelValues("ok").Inc()
		r.log.Info("draw record published", "sale", sr.id, "members", len(rec.Members), "bytes", len(f.Body), "gzip", len(f.Gzip))
	}
	sr.mu.Lock()
	sr.published = true
	sr.mu.Unlock()
	return nil
}

// PGDraws is DrawStore in PostgreSQL (migration 0010, table draw_records).
type PGDraws struct{ pool *pgxpool.Pool }

// NewPGDraws returns the PostgreSQL DrawStore.
func NewPGDraws(pool *pgxpool.Pool) *PGDraws { return &PGDraws{pool: pool} }

// SaveDraw implements DrawStore.
func (d *PGDraws) SaveDraw(ctx context.Context, saleID int64, f DrawFile) error {
	_, err := d.pool.Exec(ctx, `INSERT INTO draw_records (sale_id, body, gzip, etag) VALUES ($1, $2, $3, $4)
		ON CONFLICT (sale_id) DO NOTHING`, saleID, f.Body, f.Gzip, f.ETag)
	if err != nil {
		return fmt.Errorf("waitroom.SaveDraw: %w", err)
	}
	return nil
}

// DrawStored implements DrawStore.
func (d *PGDraws) DrawStored(ctx context.Context, saleID int64) (bool, error) {
	var ok bool
	if err := d.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM draw_records WHERE sale_id = $1)`, saleID).Scan(&ok); err != nil {
		return false, fmt.Errorf("waitroom.DrawStored: %w", err)
	}
	return ok, nil
}

// LoadDraw implements DrawStore.
func (d *PGDraws) LoadDraw(ctx context.Context, saleID, maxBody int64) (DrawFile, bool, error) {
	var f DrawFile
	err := d.pool.QueryRow(ctx, `SELECT CASE WHEN octet_length(body) <= $2 THEN body END, gzip, etag, octet_length(body)
		FROM draw_records WHERE sale_id = $1`, saleID, maxBody).Scan(&f.Body, &f.Gzip, &f.ETag, &f.Size)
	if errors.Is(err, pgx.ErrNoRows) {
		return DrawFile{}, false, nil
	}
	if err != nil {
		return DrawFile{}, false, fmt.Errorf("waitroom.LoadDraw: %w", err)
	}
	return f, true, nil
}

// expireQueue sets the sale's queue keys to expire QueueKeyTTL after its
// end (a sale without an end keeps them). The record and the checkpoint
// stay in PostgreSQL.
func (r *Room) expireQueue(ctx context.Context, saleID int64, endsAt time.Time) error {
	if r.cfg.QueueKeyTTL < 0 || endsAt.IsZero() {
		return nil
	}
	at := endsAt.Add(r.cfg.QueueKeyTTL)
	pipe := r.rdb.Pipeline()
	// Every key of the queue (store.go).
	for _, k := range [...]string{keyState, keyTickets, keyOrder, keyAdmitted, keyBuckets, keyPresence, keyGone, keyHoles, keyLease,
		keyHeldItem, keyChoice, keyFixed, keyPassed, keyWants, keyIdentity, keyShadow, keyShadowN, keyReleased, keyTiers} {
		pipe.PExpireAt(ctx, lua.QueueKey(saleID, k), at)
	}
	// The shoppers' push subscriptions (push.Store) go with the queue.
	pipe.PExpireAt(ctx, lua.PushKey(saleID), at)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("waitroom.expireQueue: sale %d: %w", saleID, err)
	}
	return nil
}
