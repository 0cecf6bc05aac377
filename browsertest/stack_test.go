package browsertest

import (
	"fmt"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring"
	"github.com/flashsale/flashsale/internal/wiring/apptest"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// stack is a whole flashsale in-process (internal/wiring/apptest) with this
// package's helpers.
type stack struct{ *apptest.Stack }

func startStack(t *testing.T, mutate ...func(*wiring.Config)) *stack {
	t.Helper()
	return &stack{apptest.Start(t, mutate...)}
}

// createSale creates a sale through the operator API, opening at startsAt,
// one item per quantity; it returns the sale and item ids.
func (s *stack) createSale(name string, startsAt time.Time, rate int, quantities ...int) (saleID int64, itemIDs []int64) {
	s.T.Helper()
	var items []map[string]any
	for i, q := range quantities {
		items = append(items, map[string]any{"productId": 501 + i, "quantity": q, "priceCents": 1999 + 1000*i})
	}
	r := s.Do("POST", "/api/admin/sales", s.Token(1, true), map[string]any{
		"name": name, "startsAt": startsAt.UTC().Format(time.RFC3339Nano),
		"admissionRatePerSecond": rate, "items": items, "allocation": "race",
	})
	s.Want(r, 201, "")
	saleID = int64(r.Body["id"].(float64))
	for _, it := range r.Body["items"].([]any) {
		itemIDs = append(itemIDs, int64(it.(map[string]any)["id"].(float64)))
	}
	return saleID, itemIDs
}

func queuePath(saleID int64) string { return fmt.Sprintf("/api/flash-sales/sales/%d/queue", saleID) }

// join puts a user in the queue by the polling API.
func (s *stack) join(user, saleID int64) apptest.Resp {
	s.T.Helper()
	r := s.Do("POST", queuePath(saleID), s.Token(user, false), nil)
	s.Want(r, 200, "")
	return r
}

// admit joins and polls until the user is admitted; it returns the
// admission token.
func (s *stack) admit(user, saleID int64) string {
	s.T.Helper()
	s.join(user, saleID)
	return testenv.EventuallyValue(s.T, fmt.Sprintf("user %d to be admitted to sale %d", user, saleID), 20*time.Second, func() (string, bool) {
		r := s.Do("GET", queuePath(saleID), s.Token(user, false), nil)
		s.Want(r, 200, "")
		at, _ := r.Body["admissionToken"].(string)
		return at, at != ""
	})
}

// buy purchases an item over HTTP and returns the order id.
func (s *stack) buy(user, itemID int64, admissionToken string) string {
	s.T.Helper()
	r := s.Do("POST", fmt.Sprintf("/api/flash-sales/items/%d/purchase", itemID), s.Token(user, false), nil,
		"X-Admission-Token", admissionToken)
	s.Want(r, 202, "")
	return r.Body["orderId"].(string)
}

func (s *stack) adminSale(saleID int64) map[string]any {
	s.T.Helper()
	r := s.Do("GET", fmt.Sprintf("/api/admin/sales/%d", saleID), s.Token(1, true), nil)
	s.Want(r, 200, "")
	return r.Body
}

// shopperURL is the shopper page of a sale, signed in through the fragment.
func (s *stack) shopperURL(base string, saleID, user int64, query string) string {
	return fmt.Sprintf("%s/sales/%d%s#token=%s", base, saleID, query, s.Token(user, false))
}

func (s *stack) operatorURL(saleID int64) string {
	return fmt.Sprintf("%s/operator?sale=%d#token=%s", s.App.PublicURL, saleID, s.Token(1, true))
}
