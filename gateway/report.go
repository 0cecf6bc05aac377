package gateway

import (
	"bytes"
	"encoding/csv"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/flashsale/flashsale"
)

var errBadFormat = flashsale.Errorf(flashsale.CodeInvalid, `format must be "json" or "csv"`)

// reportJSON is a sale's report as the operator API shows it
// (docs/CONTRACT.md, "The report after the drop").
type reportJSON struct {
	SaleID int64  `json:"saleId"`
	Name   string `json:"name"`
	State  string `json:"state"`
	// Final: the sale has ended, and its queue figures no longer move
	// (payments of its PENDING orders still may).
	Final       bool                  `json:"final"`
	StartsAt    string                `json:"startsAt"` // the opening, for times read from it
	GeneratedAt string                `json:"generatedAt"`
	Items       []reportItemJSON      `json:"items"`
	Room        flashsale.RoomReport  `json:"room"`
	Orders      flashsale.OrderReport `json:"orders"`
}

type reportItemJSON struct {
	ID        int64  `json:"id"`
	ProductID int64  `json:"productId"`
	Name      string `json:"name"`
	Quantity  int64  `json:"quantity"`
}

// adminReport is GET /api/admin/sales/{saleId}/report: the report after
// the drop, as JSON, or as CSV (one row per minute) with ?format=csv or
// Accept: text/csv.
func (s *Server) adminReport(c *fiber.Ctx) error {
	if _, ok := s.operator(c); !ok {
		return nil
	}
	id, ok := parseID(c.Params("saleId"))
	if !ok {
		return errBadSaleID
	}
	asCSV := false
	switch f := c.Query("format"); f {
	case "":
		asCSV = strings.Contains(c.Get(fiber.HeaderAccept), "text/csv")
	case "json":
	case "csv":
		asCSV = true
	default:
		return errBadFormat
	}
	if s.d.Reports == nil {
		return errNotFound
	}
	ctx, cancel := s.reqCtx()
	defer cancel()
	sale, err := s.d.SaleAdmin.Get(ctx, id)
	if err != nil {
		return err
	}
	room, err := s.d.Reports.RoomReport(ctx, id)
	if err != nil {
		return err
	}
	ord, err := s.d.Reports.OrderReport(ctx, id)
	if err != nil {
		return err
	}
	now := s.now()
	rep := reportJSON{SaleID: sale.ID, Name: sale.Name, StartsAt: fmtTime(sale.StartsAt), GeneratedAt: fmtTime(now), Room: room, Orders: ord,
		Items: make([]reportItemJSON, len(sale.Items))}
	sold := make(map[int64]int64, len(ord.Items))
	for _, it := range ord.Items {
		sold[it.ItemID] = it.Sold
	}
	allSoldOut := len(sale.Items) > 0
	for i, it := range sale.Items {
		rep.Items[i] = reportItemJSON{ID: it.ID, ProductID: it.ProductID, Name: it.Name, Quantity: it.Quantity}
		allSoldOut = allSoldOut && sold[it.ID] >= it.Quantity
	}
	state := sale.State(now, allSoldOut)
	rep.State, rep.Final = string(state), state == flashsale.SaleEnded
	c.Set(fiber.HeaderCacheControl, "no-store")
	if !asCSV {
		return c.JSON(rep)
	}
	c.Set(fiber.HeaderContentType, "text/csv; charset=utf-8")
	c.Set(fiber.HeaderContentDisposition, `attachment; filename="sale-`+strconv.FormatInt(id, 10)+`-report.csv"`)
	return c.Send(reportCSV(&rep))
}

// reportCSVHeader are the CSV's first columns; a column sold_item_<id>
// per item of the sale follows (docs/CONTRACT.md).
var reportCSVHeader = []string{"minute", "joins", "joined", "pre_queue", "admissions", "admitted", "holds", "waiting",
	"refusals", "shadowed", "wait_count", "wait_p50_ms", "wait_p90_ms", "wait_p99_ms", "sold", "paid"}

// reportCSV renders the report one row per minute: every minute of the
// room's figures and every minute an order was placed or paid in, in
// time order. The room's totals of a minute it has no row for are those of
// its last minute before (or 0).
func reportCSV(rep *reportJSON) []byte {
	room := make(map[int64]*flashsale.RoomMinute, len(rep.Room.Minutes))
	orders := make(map[int64]*flashsale.OrderMinute, len(rep.Orders.Minutes))
	var minutes []int64
	for i := range rep.Room.Minutes {
		m := &rep.Room.Minutes[i]
		k := m.At.Unix()
		room[k] = m
		minutes = append(minutes, k)
	}
	for i := range rep.Orders.Minutes {
		m := &rep.Orders.Minutes[i]
		k := m.At.Unix()
		if _, ok := room[k]; !ok {
			minutes = append(minutes, k)
		}
		orders[k] = m
	}
	slices.Sort(minutes)
	minutes = slices.Compact(minutes)

	var buf bytes.Buffer
	w := csv.NewWriter(&buf)
	header := append([]string(nil), reportCSVHeader...)
	for _, it := range rep.Items {
		header = append(header, "sold_item_"+strconv.FormatInt(it.ID, 10))
	}
	_ = w.Write(header) // a bytes.Buffer does not fail
	i64 := func(v int64) string { return strconv.FormatInt(v, 10) }
	last := flashsale.RoomMinute{PreQueue: -1}
	for _, k := range minutes {
		r := flashsale.RoomMinute{Joined: last.Joined, PreQueue: last.PreQueue, Admitted: last.Admitted, Waiting: last.Waiting}
		if m, ok := room[k]; ok {
			r = *m
			last = r
		}
		var refused, shadowed int64
		for _, n := range r.Refusals {
			refused += n
		}
		for _, n := range r.Shadowed {
			shadowed += n
		}
		o := orders[k]
		var soldN, paidN int64
		byItem := map[int64]int64{}
		if o != nil {
			soldN, paidN = o.Sold, o.Paid
			for _, it := range o.Items {
				byItem[it.ItemID] = it.Sold
			}
		}
		row := []string{time.Unix(k, 0).UTC().Format(time.RFC3339), i64(r.Joins), i64(r.Joined), i64(r.PreQueue),
			i64(r.Admissions), i64(r.Admitted), i64(r.Holds), i64(r.Waiting), i64(refused), i64(shadowed),
			i64(r.Wait.Count), i64(r.Wait.P50Ms), i64(r.Wait.P90Ms), i64(r.Wait.P99Ms), i64(soldN), i64(paidN)}
		for _, it := range rep.Items {
			row = append(row, i64(byItem[it.ID]))
		}
		_ = w.Write(row)
	}
	w.Flush()
	return buf.Bytes()
}
