package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/gofiber/fiber/v2"

	"github.com/flashsale/flashsale"
)

// The operator's controls of a running sale: the kill switch (pause,
// resume, end), live stock, a message to the queue, and the versions that
// keep two operators from overwriting each other (ETag, If-Match).

// noIfMatch is parseIfMatch's answer for a request without If-Match.
const noIfMatch = -1

var errBadIfMatch = flashsale.Invalid("If-Match", `must be a version as the ETag gives it ("7" or 7)`)

// parseIfMatch reads an If-Match header: the version in quotes, as the
// ETag sends it, or bare digits; "*" (any version) and no header are
// noIfMatch. Anything else, a list or a weak tag included, is INVALID: a
// precondition the server cannot read must not be taken as none.
func parseIfMatch(h string) (int64, error) {
	b := bytes.TrimSpace([]byte(h))
	if len(b) == 0 || string(b) == "*" {
		return noIfMatch, nil
	}
	if len(b) >= 2 && b[0] == '"' && b[len(b)-1] == '"' {
		b = b[1 : len(b)-1]
	}
	if string(b) == "0" {
		return 0, nil
	}
	v, ok := parseID(string(b))
	if !ok {
		return 0, errBadIfMatch
	}
	return v, nil
}

// setETag sends the version as the ETag of an answer.
func setETag(c *fiber.Ctx, version int64) {
	c.Set(fiber.HeaderETag, `"`+strconv.FormatInt(version, 10)+`"`)
}

// conflictJSON is the body of a 412 VERSION_CONFLICT: the contract's error
// body with the current state of what the operator tried to change.
type conflictJSON struct {
	Error   flashsale.Code `json:"error"`
	Message string         `json:"message"`
	Current any            `json:"current"`
}

func sendConflict(c *fiber.Ctx, err error, current any) error {
	c.Status(http.StatusPreconditionFailed)
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.JSON(conflictJSON{Error: flashsale.CodeVersionConflict, Message: flashsale.ErrorMessage(err), Current: current})
}

var errStaleVersion = flashsale.Errorf(flashsale.CodeVersionConflict,
	`the sale was changed by someone else since you read it; nothing changed (the current sale is in "current")`)

// saleConflict answers a sale write refused for its version with the sale
// as it is now (as GET shows it, with its ETag).
func (s *Server) saleConflict(ctx context.Context, c *fiber.Ctx, id int64, err error) error {
	v, gerr := s.adminCurrent(ctx, id)
	if gerr != nil {
		return gerr
	}
	setETag(c, v.Version)
	return sendConflict(c, err, v)
}

// adminCurrent is the sale with its live figures, as GET shows it.
func (s *Server) adminCurrent(ctx context.Context, id int64) (adminSaleJSON, error) {
	sale, err := s.d.SaleAdmin.Get(ctx, id)
	if err != nil {
		return adminSaleJSON{}, err
	}
	figs, err := s.d.SaleAdmin.Figures(ctx, id)
	if err != nil {
		return adminSaleJSON{}, err
	}
	q, err := s.d.Queue.Figures(ctx, id)
	if err != nil {
		return adminSaleJSON{}, err
	}
	v := s.adminView(&sale, figs, s.now())
	v.Queue = &q
	return v, nil
}

// saleWrite runs one versioned write of a sale: If-Match read (400 when
// malformed), then write with the version (0: none); a VERSION_CONFLICT
// is answered 412 with the current sale, a success 200 with the sale (with
// live figures) and its ETag.
func (s *Server) saleWrite(c *fiber.Ctx, id int64, write func(ctx context.Context, ifVersion int64) (flashsale.Sale, error)) error {
	ifv, err := parseIfMatch(c.Get(fiber.HeaderIfMatch))
	if err != nil {
		return err
	}
	ctx, cancel := s.reqCtx()
	defer cancel()
	if ifv == 0 {
		// No sale is at version 0: stale by definition.
		if _, err := s.d.SaleAdmin.Get(ctx, id); err != nil {
			return err
		}
		return s.saleConflict(ctx, c, id, errStaleVersion)
	}
	if ifv == noIfMatch {
		ifv = 0
	}
	sale, err := write(ctx, ifv)
	if flashsale.ErrorCode(err) == flashsale.CodeVersionConflict {
		return s.saleConflict(ctx, c, id, err)
	}
	if err != nil {
		return err
	}
	figs, err := s.d.SaleAdmin.Figures(ctx, id)
	if err != nil {
		return err
	}
	setETag(c, sale.Version)
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.JSON(s.adminView(&sale, figs, s.now()))
}

// emptyBody checks the body of a control without parameters: none, or an
// empty JSON object.
func emptyBody(body []byte) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	var req struct{}
	return decodeStrict(body, &req)
}

// parseStockRequest decodes {"add": N}, 1 ≤ N ≤ MaxStockAdd.
func parseStockRequest(body []byte) (int64, error) {
	var req struct {
		Add *int64 `json:"add"`
	}
	if err := decodeStrict(body, &req); err != nil {
		return 0, err
	}
	switch {
	case req.Add == nil:
		return 0, flashsale.Invalid("add", "required (units to add, 1 to %d)", flashsale.MaxStockAdd)
	case *req.Add < 1 || *req.Add > flashsale.MaxStockAdd:
		return 0, flashsale.Invalid("add", "must be 1 to %d", flashsale.MaxStockAdd)
	}
	return *req.Add, nil
}

// parseMessageRequest decodes {"text": "..."}: trimmed, at most
// MaxMessageLen characters, "" clears (flashsale.ParseMessage).
func parseMessageRequest(body []byte) (string, error) {
	var req struct {
		Text *string `json:"text"`
	}
	if err := decodeStrict(body, &req); err != nil {
		return "", err
	}
	if req.Text == nil {
		return "", flashsale.Invalid("text", `required ("" clears the message)`)
	}
	return flashsale.ParseMessage(*req.Text)
}

// adminAction serves the controls POST /api/admin/sales/{saleId}/pause,
// /resume, /end, /message and /items/{itemId}/stock.
func (s *Server) adminAction(kind flashsale.ActionKind) fiber.Handler {
	return func(c *fiber.Ctx) error {
		op, ok := s.operator(c)
		if !ok {
			return nil
		}
		id, ok := parseID(c.Params("saleId"))
		if !ok {
			return errBadSaleID
		}
		a := flashsale.SaleAction{Kind: kind, Actor: actor(op)}
		var err error
		switch kind {
		case flashsale.ActionStock:
			if a.ItemID, ok = parseID(c.Params("itemId")); !ok {
				return errBadItemID
			}
			a.Add, err = parseStockRequest(c.Body())
		case flashsale.ActionMessage:
			a.Text, err = parseMessageRequest(c.Body())
		default:
			err = emptyBody(c.Body())
		}
		if err != nil {
			return err
		}
		return s.saleWrite(c, id, func(ctx context.Context, ifVersion int64) (flashsale.Sale, error) {
			a.IfVersion = ifVersion
			return s.d.SaleAdmin.Act(ctx, id, a)
		})
	}
}

// settingsVersion is the "version" of a settings document (0: none).
func settingsVersion(doc json.RawMessage) int64 {
	var v struct {
		Version int64 `json:"version"`
	}
	_ = json.Unmarshal(doc, &v)
	return v.Version
}
