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
			if status.Live() { // a live order holds a unit: sold
				is.Sold += n
			}
			if status == flashsale.OrderPaid {
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
	if err := s.sellOut(ctx, saleID, &rep); err != nil {
		return flashsale.OrderReport{}, fmt.Errorf("orderstore.OrderReport: %w", err)
	}
	return rep, nil
}

// sellOutSteps are the steps a sell-out curve may take, in milliseconds,
// finest first; past the last, whole minutes.
var sellOutSteps = [...]int64{100, 250, 500, 1_000, 2_000, 5_000, 10_000, 30_000, 60_000}

// sellOutStep is the finest step that spans spanMs in at most
// flashsale.SellOutMaxSteps steps.
func sellOutStep(spanMs int64) int64 {
	for _, st := range sellOutSteps {
		if spanMs/st < flashsale.SellOutMaxSteps {
			return st
		}
	}
	minutes := spanMs/60_000/flashsale.SellOutMaxSteps + 1
	return minutes * 60_000
}

// sellOut fills rep.SellOut and each item's LastSoldAt from the sale's
// live orders.
func (s *Store) sellOut(ctx context.Context, saleID int64, rep *flashsale.OrderReport) error {
	live := map[int64]*flashsale.ItemSold{}
	for i := range rep.Items {
		live[rep.Items[i].ItemID] = &rep.Items[i]
	}
	var first, last *time.Time
	rows, err := s.pool.Query(ctx, `SELECT item_id, min(created_at), max(created_at) FROM orders
		WHERE sale_id = $1 AND status IN ('PENDING', 'PAID') GROUP BY item_id`, saleID)
	if err != nil {
		return err
	}
	for rows.Next() {
		var item int64
		var lo, hi time.Time
		if err := rows.Scan(&item, &lo, &hi); err != nil {
			rows.Close()
			return err
		}
		lo, hi = lo.UTC(), hi.UTC()
		if it := live[item]; it != nil {
			it.LastSoldAt = &hi
		}
		if first == nil || lo.Before(*first) {
			first = &lo
		}
		if last == nil || hi.After(*last) {
			last = &hi
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	rep.SellOut = flashsale.SellOut{StepMs: sellOutStep(0), Points: []flashsale.SellOutPoint{}}
	if first == nil {
		return nil
	}
	step := sellOutStep(last.Sub(*first).Milliseconds())
	rep.SellOut.StepMs = step
	// Steps are counted from the Unix epoch, so that two reads agree.
	rows, err = s.pool.Query(ctx, `SELECT (floor(extract(epoch FROM created_at) * 1000 / $2) * $2)::bigint, item_id, count(*)
		FROM orders WHERE sale_id = $1 AND status IN ('PENDING', 'PAID') GROUP BY 1, 2 ORDER BY 1, 2`, saleID, step)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var atMs, item, n int64
		if err := rows.Scan(&atMs, &item, &n); err != nil {
			return err
		}
		at := time.UnixMilli(atMs).UTC()
		pts := rep.SellOut.Points
		if len(pts) == 0 || !pts[len(pts)-1].At.Equal(at) {
			rep.SellOut.Points = append(pts, flashsale.SellOutPoint{At: at, Items: []flashsale.ItemMinute{}})
		}
		p := &rep.SellOut.Points[len(rep.SellOut.Points)-1]
		p.Items = append(p.Items, flashsale.ItemMinute{ItemID: item, Sold: n})
	}
	return rows.Err()
}
