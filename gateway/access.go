package gateway

import (
	"bytes"
	"context"
	"encoding/csv"
	"net/http"
	"strconv"
	"strings"

	"github.com/gofiber/fiber/v2"

	"github.com/flashsale/flashsale"
)

// AccessAdmin is the store of a sale's invitation codes and allowlist
// behind the operator API (*access.Store).
type AccessAdmin interface {
	// GenerateCodes makes n single-use codes of tier.
	GenerateCodes(ctx context.Context, saleID int64, n, tier int, actor string) ([]flashsale.AccessCode, error)
	// SetCodes creates or changes multi-use codes, each usable by
	// maxUses users.
	SetCodes(ctx context.Context, saleID int64, codes []string, maxUses, tier int, actor string) ([]flashsale.AccessCode, error)
	Codes(ctx context.Context, saleID int64) ([]flashsale.AccessCode, error)
	// PutAllowlistCSV parses an upload and replaces (appendTo: adds to)
	// the sale's allowlist, bumping the sale's version (ifVersion 0:
	// any); it returns the users listed.
	PutAllowlistCSV(ctx context.Context, saleID, ifVersion int64, body []byte, appendTo bool, actor string) (int, error)
	Allowlist(ctx context.Context, saleID int64) ([]flashsale.AllowlistEntry, error)
}

var errNoAccessAdmin = flashsale.Errorf(flashsale.CodeNotFound, "access codes and allowlists are not served here")

// codesRequest is the body of POST /api/admin/sales/{saleId}/codes:
// {"count": N, "tier": t} generates single-use codes; {"codes": [...],
// "maxUses": M, "tier": t} sets multi-use ones. tier defaults to 1.
type codesRequest struct {
	Count   *int     `json:"count"`
	Codes   []string `json:"codes"`
	MaxUses *int     `json:"maxUses"`
	Tier    *int     `json:"tier"`
}

// codesJSON is the answer of the codes routes.
type codesJSON struct {
	SaleID int64                  `json:"saleId"`
	Codes  []flashsale.AccessCode `json:"codes"`
}

// accessSale checks the operator and the sale id of an access route.
func (s *Server) accessSale(c *fiber.Ctx) (flashsale.Principal, int64, bool, error) {
	op, ok := s.operator(c)
	if !ok {
		return op, 0, false, nil
	}
	id, ok := parseID(c.Params("saleId"))
	if !ok {
		return op, 0, false, errBadSaleID
	}
	if s.d.Invites == nil {
		return op, 0, false, errNoAccessAdmin
	}
	return op, id, true, nil
}

// wantsCSV reports whether the caller asked for CSV.
func wantsCSV(c *fiber.Ctx) bool {
	return strings.Contains(c.Get(fiber.HeaderAccept), "text/csv")
}

// adminCodesPost is POST /api/admin/sales/{saleId}/codes.
func (s *Server) adminCodesPost(c *fiber.Ctx) error {
	op, id, ok, err := s.accessSale(c)
	if !ok {
		return err
	}
	var req codesRequest
	if err := decodeStrict(c.Body(), &req); err != nil {
		return err
	}
	tier := 1
	if req.Tier != nil {
		tier = *req.Tier
	}
	ctx, cancel := s.reqCtx()
	defer cancel()
	var codes []flashsale.AccessCode
	switch {
	case req.Count != nil && (req.Codes != nil || req.MaxUses != nil):
		return flashsale.Invalid("count", "give count (single-use codes) or codes and maxUses (multi-use), not both")
	case req.Count != nil:
		codes, err = s.d.Invites.GenerateCodes(ctx, id, *req.Count, tier, actor(op))
	case req.Codes != nil:
		if req.MaxUses == nil {
			return flashsale.Invalid("maxUses", "required with codes")
		}
		codes, err = s.d.Invites.SetCodes(ctx, id, req.Codes, *req.MaxUses, tier, actor(op))
	default:
		return flashsale.Invalid("count", "give count (single-use codes) or codes and maxUses (multi-use)")
	}
	if err != nil {
		return err
	}
	c.Status(http.StatusCreated)
	return s.sendCodes(c, id, codes, wantsCSV(c))
}

// adminCodesGet is GET /api/admin/sales/{saleId}/codes (JSON, or CSV with
// Accept: text/csv) and GET .../codes.csv.
func (s *Server) adminCodesGet(asCSV bool) fiber.Handler {
	return func(c *fiber.Ctx) error {
		_, id, ok, err := s.accessSale(c)
		if !ok {
			return err
		}
		ctx, cancel := s.reqCtx()
		defer cancel()
		codes, err := s.d.Invites.Codes(ctx, id)
		if err != nil {
			return err
		}
		return s.sendCodes(c, id, codes, asCSV || wantsCSV(c))
	}
}

func (s *Server) sendCodes(c *fiber.Ctx, id int64, codes []flashsale.AccessCode, asCSV bool) error {
	c.Set(fiber.HeaderCacheControl, "no-store")
	if !asCSV {
		if codes == nil {
			codes = []flashsale.AccessCode{}
		}
		return c.JSON(codesJSON{SaleID: id, Codes: codes})
	}
	rows := [][]string{{"code", "tier", "maxUses", "used"}}
	for _, k := range codes {
		rows = append(rows, []string{k.Code, strconv.Itoa(k.Tier), strconv.Itoa(k.MaxUses), strconv.Itoa(k.Used)})
	}
	return sendCSV(c, "sale-"+strconv.FormatInt(id, 10)+"-codes.csv", rows)
}

func sendCSV(c *fiber.Ctx, name string, rows [][]string) error {
	var b bytes.Buffer
	w := csv.NewWriter(&b)
	_ = w.WriteAll(rows) // a bytes.Buffer does not fail
	c.Set(fiber.HeaderContentType, "text/csv; charset=utf-8")
	c.Set(fiber.HeaderContentDisposition, `attachment; filename="`+name+`"`)
	return c.Send(b.Bytes())
}

// allowlistJSON is the answer of an allowlist upload.
type allowlistJSON struct {
	SaleID  int64 `json:"saleId"`
	Users   int   `json:"users"`
	Version int64 `json:"version"`
}

// adminAllowlistPut is PUT (replace) and POST (append) of
// /api/admin/sales/{saleId}/allowlist: a text/csv body of userId[,tier]
// lines, If-Match optional as on the sale's other writes.
func (s *Server) adminAllowlistPut(appendTo bool) fiber.Handler {
	return func(c *fiber.Ctx) error {
		op, id, ok, err := s.accessSale(c)
		if !ok {
			return err
		}
		ifv, err := parseIfMatch(c.Get(fiber.HeaderIfMatch))
		if err != nil {
			return err
		}
		ctx, cancel := s.reqCtx()
		defer cancel()
		switch ifv {
		case noIfMatch:
			ifv = 0
		case 0: // no sale is at version 0: stale by definition
			if _, err := s.d.SaleAdmin.Get(ctx, id); err != nil {
				return err
			}
			return s.saleConflict(ctx, c, id, errStaleVersion)
		}
		n, err := s.d.Invites.PutAllowlistCSV(ctx, id, ifv, bytes.Clone(c.Body()), appendTo, actor(op))
		if flashsale.ErrorCode(err) == flashsale.CodeVersionConflict {
			return s.saleConflict(ctx, c, id, err)
		}
		if err != nil {
			return err
		}
		sale, err := s.d.SaleAdmin.Get(ctx, id)
		if err != nil {
			return err
		}
		setETag(c, sale.Version)
		c.Set(fiber.HeaderCacheControl, "no-store")
		return c.JSON(allowlistJSON{SaleID: id, Users: n, Version: sale.Version})
	}
}

// adminAllowlistGet is GET /api/admin/sales/{saleId}/allowlist: the list
// as CSV (userId,tier), or JSON with Accept: application/json.
func (s *Server) adminAllowlistGet(c *fiber.Ctx) error {
	_, id, ok, err := s.accessSale(c)
	if !ok {
		return err
	}
	ctx, cancel := s.reqCtx()
	defer cancel()
	list, err := s.d.Invites.Allowlist(ctx, id)
	if err != nil {
		return err
	}
	c.Set(fiber.HeaderCacheControl, "no-store")
	if strings.Contains(c.Get(fiber.HeaderAccept), "application/json") {
		if list == nil {
			list = []flashsale.AllowlistEntry{}
		}
		return c.JSON(struct {
			SaleID int64                      `json:"saleId"`
			Users  []flashsale.AllowlistEntry `json:"users"`
		}{id, list})
	}
	rows := [][]string{{"userId", "tier"}}
	for _, e := range list {
		rows = append(rows, []string{strconv.FormatInt(e.UserID, 10), strconv.Itoa(e.Tier)})
	}
	return sendCSV(c, "sale-"+strconv.FormatInt(id, 10)+"-allowlist.csv", rows)
}
