package testenv

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

func TestMain(m *testing.M) { Main(m) }

func TestServicesIsolated(t *testing.T) {
	ctx := context.Background()
	a, b := Redis(t), Redis(t)
	if err := a.Set(ctx, "k", "a", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := b.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("second database sees the first's key: n=%d err=%v", n, err)
	}
	p1, p2 := Postgres(t), Postgres(t)
	if _, err := p1.Exec(ctx, `INSERT INTO sales (name, starts_at, admission_rate, shuffle_seed, shuffle_commitment) VALUES ('x', now(), 1, '\x00', '')`); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := p2.QueryRow(ctx, `SELECT count(*) FROM sales`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("second database sees %d sales (err %v), want 0", n, err)
	}
	k := NewKafka(t)
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "flash-sale-orders", Value: []byte("x")}).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}
