package orderstore

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/flashsale/flashsale"
)

// OrderReport is the orders' part of a sale's report: the orders by
// status and item, the payment conversion, and per minute the orders
// placed that are still live, per item (the sell-out curve), and the
// orders paid. A minute is one of PostgreSQL's date_trunc('minute'),
// at UTC.
func (s *Store) OrderReport(ctx context.Context, saleID int64) (flashsale.OrderReport, error) {
	counts, err := s.CountBySale(ctx, saleID)
	if err != nil {
		return flashsale.OrderReport{}, fmt.Errorf("orderstore.OrderReport: %w", err)
	}
	rep := flashsale.OrderReport{ByStatus: map[flashsale.OrderStatus]int64{}, Items: []flashsale.ItemSold{}, Minutes: []flashsale.OrderMinute{}}
	for item, byStatus := range counts {
		is := flashsale.ItemSold{ItemID: item}
		for status, n := range byStatus {
			rep.ByStatus[status] += n
			switch status {
			case flashsale.OrderPending:
				is.Sold += n
			case flashsale.OrderPaid:
				is.Sold += n
				is.Paid += n
			}
			if status != flashsale.OrderRejected {
				rep.Placed += n
			}
		}
		rep.Sold += is.Sold
		rep.Paid += is.Paid
		rep.Items = append(rep.Items, is)
	}
	sort.Slice(rep.Items, func(i, j int) bool { return rep.Items[i].ItemID < rep.Items[j].ItemID })
	if rep.Placed > 0 {
		rep.Conversion = float64(rep.Paid) / float64(rep.Placed)
	}

	// One pass over the sale's orders: a row per (minute, item) placed
	// with the live ones counted, and a row per minute paid (item 0).
	rows, err := s.pool.Query(ctx, `
		SELECT date_trunc('minute', created_at AT TIME ZONE 'UTC'), item_id,
			count(*) FILTER (WHERE status IN ('PENDING', 'PAID')), 0
		FROM orders WHERE sale_id = $1 GROUP BY 1, 2
		UNION ALL
		SELECT date_trunc('minute', paid_at AT TIME ZONE 'UTC'), 0, 0, count(*)
		FROM orders WHERE sale_id = $1 AND status = 'PAID' AND paid_at IS NOT NULL GROUP BY 1
		ORDER BY 1, 2`, saleID)
	if err != nil {
		return flashsale.OrderReport{}, fmt.Errorf("orderstore.OrderReport: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			at               time.Time
			item, sold, paid int64
		)
		if err := rows.Scan(&at, &item, &sold, &paid); err != nil {
			return flashsale.OrderReport{}, fmt.Errorf("orderstore.OrderReport: %w", err)
		}
		at = time.Date(at.Year(), at.Month(), at.Day(), at.Hour(), at.Minute(), 0, 0, time.UTC)
		if n := len(rep.Minutes); n == 0 || !rep.Minutes[n-1].At.Equal(at) {
			rep.Minutes = append(rep.Minutes, flashsale.OrderMinute{At: at, Items: []flashsale.ItemMinute{}})
		}
		m := &rep.Minutes[len(rep.Minutes)-1]
		if item != 0 {
			m.Items = append(m.Items, flashsale.ItemMinute{ItemID: item, Sold: sold})
			m.Sold += sold
		}
		m.Paid += paid
	}
	if err := rows.Err(); err != nil {
		return flashsale.OrderReport{}, fmt.Errorf("orderstore.OrderReport: %w", err)
	}
	return rep, nil
}
