package waitroom

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strconv"

	"github.com/flashsale/flashsale"
)

// Queue states of a shopper (CONTRACT section 4).
const (
	StatePrequeue = "PREQUEUE"
	StateWaiting  = "WAITING"
	StateAdmitted = "ADMITTED"
	StateSoldOut  = "SOLD_OUT"
	StateEnded    = "ENDED"
	// StatePaused: the operator paused the sale; the shopper keeps the
	// place and is admitted in turn after the resume.
	StatePaused = "PAUSED"
)

// Server message types.
const (
	TypeStatus    = "status"
	TypeAdmitted  = "admitted"
	TypeChallenge = "challenge"
	TypeError     = "error"
	// TypeMessage is the operator's message to the queue: sent to every
	// connection of the sale when it is set (text "" when it is cleared),
	// and after the first status to a shopper who joins later.
	TypeMessage = "message"
)

// Client message types.
const (
	// TypeJoin is the first message: the shopper's access token (and a
	// proof-of-work solution after a challenge).
	TypeJoin = "join"
	// TypeChoose is the item a joined shopper wants at their turn, in a
	// sale allocated in queue order; it may come any number of times
	// until the turn.
	TypeChoose = "choose"
)

// ClientMessage is a message from the shopper's page: a join, then, in a
// sale allocated in queue order, any number of chooses.
type ClientMessage struct {
	Type        string          `json:"type"`
	AccessToken string          `json:"accessToken,omitempty"`
	PoW         json.RawMessage `json:"pow,omitempty"`
	// ItemID is the chosen item of a choose (a positive id).
	ItemID int64 `json:"itemId,omitempty"`
	// Code is the invitation code of a join to a codes sale (at most
	// MaxCodeLen bytes; "" none).
	Code string `json:"code,omitempty"`
}

// MaxCodeLen bounds an invitation code in a join.
const MaxCodeLen = 64

var errNotJoin = &flashsale.Error{Code: flashsale.CodeInvalid,
	Message: `expected {"type":"join","accessToken":"..."} or {"type":"choose","itemId":N}`}

var errCodeTooLong = flashsale.Errorf(flashsale.CodeInvalid, "code: at most %d bytes", MaxCodeLen)

// ParseClientMessage parses one client message. Anything but a JSON object
// with "type":"join" and a string accessToken (pow, when present, must be a
// JSON object; code, when present, at most MaxCodeLen bytes), or "type":"choose" and a positive integer itemId, is
// INVALID. An empty accessToken parses; it is refused as UNAUTHENTICATED
// by the token check. Which type is expected when is the caller's rule
// (a join first, then chooses).
func ParseClientMessage(b []byte) (ClientMessage, error) {
	b = bytes.TrimSpace(b)
	if m, ok := parseBareJoin(b); ok {
		return m, nil
	}
	return parseClientJSON(b)
}

// The two shapes of a bare join: the page's (type first) and a Go map's
// (keys sorted), the token in between.
var (
	joinTypeFirst  = []byte(`{"type":"join","accessToken":"`)
	joinTypeFirstE = []byte(`"}`)
	joinTokenFirst = []byte(`{"accessToken":"`)
	joinTokenLast  = []byte(`","type":"join"}`)
)

// parseBareJoin parses a join of exactly one of the two shapes with a
// token of JWT characters (base64url and dots), what nearly every join
// is, without encoding/json's reflection: its answer is then what
// parseClientJSON gives (FuzzParseClientMessage compares them). Anything
// else, spaces, escapes, other keys, is not taken (false).
func parseBareJoin(b []byte) (ClientMessage, bool) {
	var tok []byte
	switch {
	case len(b) >= len(joinTypeFirst)+len(joinTypeFirstE) && bytes.HasPrefix(b, joinTypeFirst) && bytes.HasSuffix(b, joinTypeFirstE):
		tok = b[len(joinTypeFirst) : len(b)-len(joinTypeFirstE)]
	case len(b) >= len(joinTokenFirst)+len(joinTokenLast) && bytes.HasPrefix(b, joinTokenFirst) && bytes.HasSuffix(b, joinTokenLast):
		tok = b[len(joinTokenFirst) : len(b)-len(joinTokenLast)]
	default:
		return ClientMessage{}, false
	}
	for _, c := range tok {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return ClientMessage{}, false
		}
	}
	return ClientMessage{Type: TypeJoin, AccessToken: string(tok)}, true
}

// parseClientJSON is ParseClientMessage through encoding/json, for b
// trimmed.
func parseClientJSON(b []byte) (ClientMessage, error) {
	var m ClientMessage
	if len(b) == 0 || b[0] != '{' {
		return ClientMessage{}, errNotJoin
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return ClientMessage{}, errNotJoin
	}
	switch m.Type {
	case TypeJoin:
		if len(m.Code) > MaxCodeLen {
			return ClientMessage{}, errCodeTooLong
		}
	case TypeChoose:
		if m.ItemID <= 0 {
			return ClientMessage{}, errNotJoin
		}
		return ClientMessage{Type: TypeChoose, ItemID: m.ItemID}, nil
	default:
		return ClientMessage{}, errNotJoin
	}
	if len(m.PoW) > 0 {
		p := bytes.TrimSpace(m.PoW)
		if bytes.Equal(p, []byte("null")) {
			m.PoW = nil
		} else if p[0] != '{' {
			return ClientMessage{}, errNotJoin
		} else {
			m.PoW = append(json.RawMessage(nil), p...)
		}
	}
	return m, nil
}

// AdmittedItem is an item the admitted shopper may buy.
type AdmittedItem struct {
	ID          int64  `json:"id"`
	PurchaseURL string `json:"purchaseUrl"`
}

// Status is a shopper's place in the queue: the WebSocket "status" message
// and the polling answer. Once admitted it carries the admission token
// (polling only: over the WebSocket the token comes in the "admitted"
// message). Type "challenge" (polling Join only) carries the JoinGuard's
// challenge object in Challenge and marshals as that object plus "type".
type Status struct {
	Type           string `json:"type"`
	State          string `json:"state,omitempty"`
	ServerTimeMs   int64  `json:"serverTimeMs"`
	OpensAtMs      int64  `json:"opensAtMs"`
	Position       int64  `json:"position"`
	EtaSeconds     int64  `json:"etaSeconds"`
	AdmissionToken string `json:"admissionToken,omitempty"`
	ExpiresAtMs    int64  `json:"expiresAtMs,omitempty"`
	// NotBeforeMs is when the token starts to buy (the first wave's, made
	// before the opening: the opening instant); absent: at once.
	NotBeforeMs int64 `json:"notBeforeMs,omitempty"`
	// HoldUntilMs and HeldItemID: in a sale allocated in queue order, one
	// unit of that item is held for the admitted shopper until then.
	HoldUntilMs int64 `json:"holdUntilMs,omitempty"`
	HeldItemID  int64 `json:"heldItemId,omitempty"`
	// ChosenItemID is the item the shopper chose for their turn (queue
	// order, before the turn; absent: none chosen). ChosenSoldOut: that
	// item has no unit free now (it is in SoldOutItems); the shopper
	// keeps the place and may choose another.
	ChosenItemID  int64 `json:"chosenItemId,omitempty"`
	ChosenSoldOut bool  `json:"chosenSoldOut,omitempty"`
	// SoldOutItems are the sale's items shown sold out now, [] for none
	// (absent until the room has read the stock): an item a shopper was
	// answered SOLD_OUT for is back when it is not listed.
	SoldOutItems *[]int64       `json:"soldOutItems,omitempty"`
	Items        []AdmittedItem `json:"items,omitempty"`
	// Message is the operator's message (polling only; nil: none).
	Message *SaleMessage `json:"message,omitempty"`
	// DrawSecret is the shopper's member secret in this sale (polling
	// only): with it, and only with it, a shopper finds their own line in
	// the public draw record (docs/DRAW.md).
	DrawSecret string          `json:"drawSecret,omitempty"`
	Challenge  json.RawMessage `json:"-"`
}

// SaleMessage is the operator's message to the queue.
type SaleMessage struct {
	Text string `json:"text"`
	AtMs int64  `json:"atMs"`
}

// saleMessage is the sale's message, nil when none.
func saleMessage(s *flashsale.Sale) *SaleMessage {
	if s == nil || s.Message == "" {
		return nil
	}
	return &SaleMessage{Text: s.Message, AtMs: s.MessageAt.UnixMilli()}
}

// appendMessage encodes a "message" message.
func appendMessage(b []byte, text string, atMs int64) []byte {
	m, _ := json.Marshal(struct {
		Type string `json:"type"`
		Text string `json:"text"`
		AtMs int64  `json:"atMs"`
	}{TypeMessage, text, atMs})
	return append(b, m...)
}

// MarshalJSON writes a status object, or the challenge object for Type
// "challenge".
func (s Status) MarshalJSON() ([]byte, error) {
	if s.Type == TypeChallenge {
		return challengeMessage(s.Challenge)
	}
	type plain Status
	return json.Marshal(plain(s))
}

// challengeMessage is {"type":"challenge", ...fields of ch}.
func challengeMessage(ch json.RawMessage) ([]byte, error) {
	fields := map[string]json.RawMessage{}
	if len(ch) > 0 {
		if err := json.Unmarshal(ch, &fields); err != nil {
			return nil, errors.New("waitroom: challenge is not a JSON object")
		}
	}
	fields["type"] = json.RawMessage(`"challenge"`)
	return json.Marshal(fields)
}

// view is what a shopper sees at one moment; the WebSocket sends a status
// message when it changes.
type view struct {
	state    string
	position int64
	eta      int64
	// out is the sale's items shown sold out; a new pointer at every
	// change, so that a change is a new view and reaches the shopper
	// (nil: not known yet).
	out *itemsOut
	// chosen is the item the shopper chose (queue order, before the
	// turn; 0: none).
	chosen int64
}

// chosenOut reports whether the chosen item is shown sold out.
func (v view) chosenOut() bool {
	return v.chosen != 0 && v.out != nil && slices.Contains(v.out.ids, v.chosen)
}

// itemsOut is the set of a sale's items shown sold out, as the status
// message's soldOutItems (a JSON array, encoded once per change).
type itemsOut struct {
	ids  []int64
	json []byte
}

func newItemsOut(ids []int64) *itemsOut {
	b := append(make([]byte, 0, 2+8*len(ids)), '[')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, id, 10)
	}
	return &itemsOut{ids: ids, json: append(b, ']')}
}

// appendStatus encodes a status message without reflection (it is sent to
// every connection on every change).
func appendStatus(b []byte, v view, serverMs, opensMs int64) []byte {
	b = append(b, `{"type":"status","state":"`...)
	b = append(b, v.state...)
	b = append(b, `","serverTimeMs":`...)
	b = strconv.AppendInt(b, serverMs, 10)
	b = append(b, `,"opensAtMs":`...)
	b = strconv.AppendInt(b, opensMs, 10)
	b = append(b, `,"position":`...)
	b = strconv.AppendInt(b, v.position, 10)
	b = append(b, `,"etaSeconds":`...)
	b = strconv.AppendInt(b, v.eta, 10)
	if v.out != nil {
		b = append(b, `,"soldOutItems":`...)
		b = append(b, v.out.json...)
	}
	if v.chosen != 0 {
		b = append(b, `,"chosenItemId":`...)
		b = strconv.AppendInt(b, v.chosen, 10)
		if v.chosenOut() {
			b = append(b, `,"chosenSoldOut":true`...)
		}
	}
	return append(b, '}')
}

// TypeChoiceRefused answers a choose that changed nothing; the
// connection stays open.
const TypeChoiceRefused = "choiceRefused"

// appendChoiceRefused encodes the refusal of a choose of itemID.
func appendChoiceRefused(b []byte, itemID int64, err error) []byte {
	m, _ := json.Marshal(struct {
		Type    string `json:"type"`
		Error   string `json:"error"`
		Message string `json:"message"`
		ItemID  int64  `json:"itemId"`
	}{TypeChoiceRefused, string(flashsale.ErrorCode(err)), flashsale.ErrorMessage(err), itemID})
	return append(b, m...)
}

// appendDrawSecret adds drawSecret to the status message b ends with.
// secret is hex: it needs no JSON escaping.
func appendDrawSecret(b []byte, secret string) []byte {
	b = append(b[:len(b)-1], `,"drawSecret":"`...)
	b = append(b, secret...)
	return append(b, `"}`...)
}

// appendAdmitted encodes an admitted message without reflection, as
// json.Marshal of admittedMessage writes it, from the sale's items already
// encoded (itemsJSON). tok must need no JSON escaping (admission tokens are
// base64url). notBeforeMs 0 leaves the field out.
func appendAdmitted(b []byte, tok string, expiresAtMs, notBeforeMs, heldItem int64, itemsJSON []byte) []byte {
	b = append(b, `{"type":"admitted","admissionToken":"`...)
	b = append(b, tok...)
	b = append(b, `","expiresAtMs":`...)
	b = strconv.AppendInt(b, expiresAtMs, 10)
	if notBeforeMs != 0 {
		b = append(b, `,"notBeforeMs":`...)
		b = strconv.AppendInt(b, notBeforeMs, 10)
	}
	if heldItem != 0 {
		// Queue order: one unit of heldItem is held until the token's
		// expiry.
		b = append(b, `,"holdUntilMs":`...)
		b = strconv.AppendInt(b, expiresAtMs, 10)
		b = append(b, `,"heldItemId":`...)
		b = strconv.AppendInt(b, heldItem, 10)
	}
	b = append(b, `,"items":`...)
	b = append(b, itemsJSON...)
	return append(b, '}')
}

type admittedMessage struct {
	Type           string         `json:"type"`
	AdmissionToken string         `json:"admissionToken"`
	ExpiresAtMs    int64          `json:"expiresAtMs"`
	NotBeforeMs    int64          `json:"notBeforeMs,omitempty"`
	HoldUntilMs    int64          `json:"holdUntilMs,omitempty"`
	HeldItemID     int64          `json:"heldItemId,omitempty"`
	Items          []AdmittedItem `json:"items"`
}

type errorMessage struct {
	Type    string `json:"type"`
	Error   string `json:"error"`
	Message string `json:"message"`
}

func encodeError(code flashsale.Code, msg string) []byte {
	b, _ := json.Marshal(errorMessage{Type: TypeError, Error: string(code), Message: msg})
	return b
}

// admittedItems lists the sale's items with their purchase URLs.
func admittedItems(s *flashsale.Sale) []AdmittedItem {
	items := make([]AdmittedItem, len(s.Items))
	for i, it := range s.Items {
		id := strconv.FormatInt(it.ID, 10)
		items[i] = AdmittedItem{ID: it.ID, PurchaseURL: "/api/flash-sales/items/" + id + "/purchase"}
	}
	return items
}
