package push_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/push"
	"github.com/flashsale/flashsale/push/pushtest"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// fixture is a sender over a real Redis and a local push service that
// decrypts what it gets.
type fixture struct {
	svc    *pushtest.Service
	store  *push.Store
	sender *push.Sender
	hosts  push.Hosts
	cfg    push.Config
}

func newFixture(t *testing.T, queue int) *fixture {
	t.Helper()
	pub, priv, err := push.GenerateKeys()
	if err != nil {
		t.Fatal(err)
	}
	if err := push.CheckKeys(pub, priv, "mailto:ops@example.com"); err != nil {
		t.Fatalf("CheckKeys of fresh keys: %v", err)
	}
	f := &fixture{svc: pushtest.New(t, pub), store: push.NewStore(testenv.Redis(t)), hosts: push.ParseHosts("127.0.0.1")}
	f.cfg = push.Config{PublicKey: pub, PrivateKey: priv, Subject: "mailto:ops@example.com", Queue: queue, Insecure: f.hosts}
	f.sender = push.New(f.cfg, f.store, nil, nil)
	return f
}

func (f *fixture) run(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.sender.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// subscribe makes a browser subscription at path and stores it for the
// user through Parse, as the gateway does.
func (f *fixture) subscribe(t *testing.T, saleID, userID int64, path string) {
	t.Helper()
	sub, err := push.Parse(f.svc.Subscribe(path), f.hosts)
	if err != nil {
		t.Fatalf("Parse of a browser's subscription: %v", err)
	}
	if err := f.store.Put(context.Background(), saleID, userID, sub, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
}

func users(u ...int64) func(context.Context) ([]int64, error) {
	return func(context.Context) ([]int64, error) { return u, nil }
}

func receive(t *testing.T, f *fixture) pushtest.Notice {
	t.Helper()
	select {
	case n := <-f.svc.Received:
		return n
	case <-time.After(10 * time.Second):
		t.Fatalf("no notification; the service refused: %v", f.svc.Err())
	}
	return pushtest.Notice{}
}

func TestAdmittedShopperGetsDecryptableNotice(t *testing.T) {
	f := newFixture(t, 0)
	f.subscribe(t, 7, 42, "/u/42")
	f.run(t)
	// 43 never subscribed: nothing is sent for it.
	f.sender.Admitted(7, users(43, 42))
	n := receive(t, f)
	if err := f.svc.Err(); err != nil {
		t.Fatalf("the push service refused a request: %v", err)
	}
	var got push.Notice
	if err := json.Unmarshal(n.Payload, &got); err != nil {
		t.Fatalf("payload %q: %v", n.Payload, err)
	}
	want := push.Notice{Type: "admitted", SaleID: 7, URL: "/sales/7"}
	if got != want {
		t.Errorf("notice = %+v, want %+v", got, want)
	}
	if n.Path != "/u/42" || n.Subject != "mailto:ops@example.com" || n.Urgency != "high" || n.TTL != "300" {
		t.Errorf("request: path %q sub %q urgency %q TTL %q, want /u/42, the subject, high, 300", n.Path, n.Subject, n.Urgency, n.TTL)
	}
	if _, ok, _ := f.store.Get(context.Background(), 7, 42); !ok {
		t.Error("a delivered subscription was dropped")
	}
}

func TestGoneEndpointDropsSubscription(t *testing.T) {
	for _, status := range []int{http.StatusGone, http.StatusNotFound} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			f := newFixture(t, 0)
			f.subscribe(t, 3, 1, "/gone")
			f.subscribe(t, 3, 2, "/live")
			f.svc.Answer("/gone", status)
			f.run(t)
			f.sender.Admitted(3, users(1, 2))
			receive(t, f) // /live's, after /gone's
			if got := f.svc.Requests("/gone"); got != 1 {
				t.Fatalf("requests to /gone = %d, want 1", got)
			}
			if _, ok, err := f.store.Get(context.Background(), 3, 1); err != nil || ok {
				t.Errorf("subscription answered %d: kept %v (err %v), want dropped", status, ok, err)
			}
			if _, ok, _ := f.store.Get(context.Background(), 3, 2); !ok {
				t.Error("the live subscription was dropped")
			}
		})
	}
}

func TestOtherRefusalKeepsSubscription(t *testing.T) {
	f := newFixture(t, 0)
	f.subscribe(t, 3, 1, "/busy")
	f.subscribe(t, 3, 2, "/live")
	f.svc.Answer("/busy", http.StatusTooManyRequests)
	f.run(t)
	f.sender.Admitted(3, users(1, 2))
	receive(t, f)
	if _, ok, _ := f.store.Get(context.Background(), 3, 1); !ok {
		t.Error("a subscription answered 429 was dropped; only 404 and 410 say it is gone")
	}
}

func TestResubscribedWhileSendingIsKept(t *testing.T) {
	// A 410 for an old subscription must not drop the one the shopper
	// made since.
	f := newFixture(t, 0)
	f.subscribe(t, 5, 1, "/old")
	f.svc.Answer("/old", http.StatusGone)
	f.run(t)
	f.sender.Admitted(5, func(ctx context.Context) ([]int64, error) {
		return []int64{1}, nil
	})
	testenv.Eventually(t, "the 410 answered", 10*time.Second, func() bool { return f.svc.Requests("/old") == 1 })
	f.subscribe(t, 5, 1, "/new")
	f.sender.Admitted(5, users(1))
	n := receive(t, f)
	if n.Path != "/new" {
		t.Errorf("notice went to %q, want /new", n.Path)
	}
}

func TestFullQueueDropsWithoutBlocking(t *testing.T) {
	f := newFixture(t, 1)
	f.subscribe(t, 9, 1, "/a")
	f.subscribe(t, 9, 2, "/b")
	var asked atomic.Bool
	f.sender.Admitted(9, users(1))
	done := make(chan struct{})
	go func() {
		f.sender.Admitted(9, func(context.Context) ([]int64, error) { asked.Store(true); return []int64{2}, nil })
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Admitted blocked on a full queue")
	}
	f.run(t)
	if n := receive(t, f); n.Path != "/a" {
		t.Errorf("notice to %q, want /a", n.Path)
	}
	f.sender.Admitted(9, users()) // a marker: once it is taken, the dropped batch would have been too
	testenv.Eventually(t, "the queue drained", 10*time.Second, func() bool { return len(f.svc.Received) == 0 })
	if asked.Load() || f.svc.Requests("/b") != 0 {
		t.Error("the batch dropped on a full queue was sent")
	}
}

func TestNoSubscriptionReadsNoPlaces(t *testing.T) {
	f := newFixture(t, 0)
	f.run(t)
	resolved := make(chan struct{}, 1)
	f.sender.Admitted(11, func(context.Context) ([]int64, error) { resolved <- struct{}{}; return nil, nil })
	f.subscribe(t, 12, 1, "/x")
	f.sender.Admitted(12, users(1))
	receive(t, f)
	select {
	case <-resolved:
		t.Error("the places of a sale nobody subscribed in were read")
	default:
	}
}

// TestSenderConnectsToPublicAddressesOnly: a host name that resolves to
// a loopback address passes Parse (it is a name) but not the sender's
// connect check, unless the name itself is allowed.
func TestSenderConnectsToPublicAddressesOnly(t *testing.T) {
	f := newFixture(t, 0)
	named := strings.Replace(string(f.svc.Subscribe("/named")), "127.0.0.1", "localhost", 1)
	sub, err := push.Parse([]byte(named), push.ParseHosts("localhost"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.store.Put(context.Background(), 4, 1, sub, time.Time{}); err != nil {
		t.Fatal(err)
	}
	f.subscribe(t, 4, 2, "/marker")
	f.run(t)
	f.sender.Admitted(4, users(1, 2))
	if n := receive(t, f); n.Path != "/marker" {
		t.Fatalf("notice to %q, want /marker", n.Path)
	}
	if got := f.svc.Requests("/named"); got != 0 {
		t.Errorf("requests to a name resolving to loopback = %d, want 0", got)
	}
}

func TestCheckKeys(t *testing.T) {
	pub, priv, _ := push.GenerateKeys()
	otherPub, _, _ := push.GenerateKeys()
	for _, tc := range []struct {
		name, pub, priv, subject string
		ok                       bool
	}{
		{"off", "", "", "", true},
		{"pair", pub, priv, "mailto:a@b.example", true},
		{"https subject", pub, priv, "https://shop.example/contact", true},
		{"public alone", pub, "", "mailto:a@b.example", false},
		{"private alone", "", priv, "mailto:a@b.example", false},
		{"not the pair", otherPub, priv, "mailto:a@b.example", false},
		{"bad private", pub, "xyz", "mailto:a@b.example", false},
		{"no subject", pub, priv, "", false},
		{"plain address", pub, priv, "a@b.example", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := push.CheckKeys(tc.pub, tc.priv, tc.subject)
			if (err == nil) != tc.ok {
				t.Errorf("CheckKeys = %v, want ok %v", err, tc.ok)
			}
		})
	}
}

// A browser's keys, valid (a point on P-256 and a 16-byte secret).
const (
	goodDH   = "BNcRdreALRFXTkOOUHK1EtK2wtaz5Ry4YfYCA_0QTpQtUbVlUls0VJXg7A8u-Ts1XbjhazAkj7I99e8QcYP7DkM"
	goodAuth = "tBHItJI5svbpez7KI4CCXg"
)

func subJSON(endpoint, dh, auth string) string {
	b, _ := json.Marshal(map[string]any{"endpoint": endpoint, "expirationTime": nil, "keys": map[string]string{"p256dh": dh, "auth": auth}})
	return string(b)
}

func TestParse(t *testing.T) {
	hosts := push.ParseHosts("127.0.0.1, push.test,[::1]")
	for _, tc := range []struct {
		name, body string
		code       flashsale.Code // "": accepted
	}{
		{"browser's", subJSON("https://fcm.googleapis.com/fcm/send/abc:def", goodDH, goodAuth), ""},
		{"padded keys", subJSON("https://updates.push.services.mozilla.com/wpush/v2/x", goodDH+"=", goodAuth+"=="), ""},
		{"allowed http host", subJSON("http://127.0.0.1:8080/u/1", goodDH, goodAuth), ""},
		{"allowed name", subJSON("http://push.test/u/1", goodDH, goodAuth), ""},
		{"allowed v6", subJSON("http://[::1]:9/u", goodDH, goodAuth), ""},
		{"http", subJSON("http://fcm.googleapis.com/fcm/send/x", goodDH, goodAuth), flashsale.CodeInvalid},
		{"other scheme", subJSON("ftp://fcm.googleapis.com/x", goodDH, goodAuth), flashsale.CodeInvalid},
		{"javascript", subJSON("javascript:alert(1)", goodDH, goodAuth), flashsale.CodeInvalid},
		{"relative", subJSON("/u/1", goodDH, goodAuth), flashsale.CodeInvalid},
		{"loopback over https", subJSON("https://127.0.0.2/u", goodDH, goodAuth), flashsale.CodeInvalid},
		{"private address", subJSON("https://10.1.2.3/u", goodDH, goodAuth), flashsale.CodeInvalid},
		{"link-local", subJSON("https://169.254.169.254/latest", goodDH, goodAuth), flashsale.CodeInvalid},
		{"localhost", subJSON("https://localhost/u", goodDH, goodAuth), flashsale.CodeInvalid},
		{"credentials", subJSON("https://u:p@fcm.googleapis.com/x", goodDH, goodAuth), flashsale.CodeInvalid},
		{"fragment", subJSON("https://fcm.googleapis.com/x#y", goodDH, goodAuth), flashsale.CodeInvalid},
		{"bad port", subJSON("https://fcm.googleapis.com:99999/x", goodDH, goodAuth), flashsale.CodeInvalid},
		{"space", subJSON("https://fcm.googleapis.com/a b", goodDH, goodAuth), flashsale.CodeInvalid},
		{"long endpoint", subJSON("https://fcm.googleapis.com/"+strings.Repeat("a", push.MaxEndpointBytes), goodDH, goodAuth), flashsale.CodeInvalid},
		{"no endpoint", subJSON("", goodDH, goodAuth), flashsale.CodeInvalid},
		{"short dh", subJSON("https://fcm.googleapis.com/x", goodDH[:40], goodAuth), flashsale.CodeInvalid},
		{"dh off the curve", subJSON("https://fcm.googleapis.com/x", "B"+strings.Repeat("A", 86), goodAuth), flashsale.CodeInvalid},
		{"dh not base64", subJSON("https://fcm.googleapis.com/x", "!!"+goodDH[2:], goodAuth), flashsale.CodeInvalid},
		{"short auth", subJSON("https://fcm.googleapis.com/x", goodDH, "AAAA"), flashsale.CodeInvalid},
		{"no keys", `{"endpoint":"https://fcm.googleapis.com/x"}`, flashsale.CodeInvalid},
		{"unknown field", `{"endpoint":"https://fcm.googleapis.com/x","keys":{"p256dh":"` + goodDH + `","auth":"` + goodAuth + `"},"x":1}`, flashsale.CodeInvalid},
		{"two objects", subJSON("https://fcm.googleapis.com/x", goodDH, goodAuth) + "{}", flashsale.CodeInvalid},
		{"not JSON", `endpoint=https://x`, flashsale.CodeInvalid},
		{"empty", ``, flashsale.CodeInvalid},
		{"too large", `{"endpoint":"` + strings.Repeat(" ", push.MaxBodyBytes) + `"}`, flashsale.CodeTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sub, err := push.Parse([]byte(tc.body), hosts)
			if got := flashsale.ErrorCode(err); got != tc.code {
				t.Fatalf("Parse = %v (code %q), want code %q", err, got, tc.code)
			}
			if err == nil && (sub.Endpoint == "" || sub.P256dh != goodDH || sub.Auth != goodAuth) {
				t.Errorf("Parse = %+v, want the keys without padding", sub)
			}
		})
	}
}

// FuzzParse: outside input never panics Parse, and what it accepts is an
// endpoint it may post to with keys of the right sizes.
func FuzzParse(f *testing.F) {
	f.Add([]byte(subJSON("https://fcm.googleapis.com/fcm/send/abc", goodDH, goodAuth)))
	f.Add([]byte(subJSON("http://127.0.0.1:1/u", goodDH, goodAuth)))
	f.Add([]byte(`{"endpoint":"https://[::ffff:10.0.0.1]/x","keys":{"p256dh":"","auth":""}}`))
	f.Add([]byte(`{}`))
	hosts := push.ParseHosts("127.0.0.1")
	f.Fuzz(func(t *testing.T, body []byte) {
		sub, err := push.Parse(body, hosts)
		if err != nil {
			if c := flashsale.ErrorCode(err); c != flashsale.CodeInvalid && c != flashsale.CodeTooLarge {
				t.Fatalf("Parse error %v has code %q", err, c)
			}
			return
		}
		if !strings.HasPrefix(sub.Endpoint, "https://") && !strings.HasPrefix(sub.Endpoint, "http://127.0.0.1") {
			t.Fatalf("accepted endpoint %q", sub.Endpoint)
		}
		if len(sub.P256dh) != 87 || len(sub.Auth) != 22 {
			t.Fatalf("accepted keys %q %q", sub.P256dh, sub.Auth)
		}
	})
}

// TestShutdownFinishesTheRequestInFlight: Run returns once its context
// ends, after the request it had started is answered (not cut off), and
// the batches still queued are dropped.
func TestShutdownFinishesTheRequestInFlight(t *testing.T) {
	f := newFixture(t, 0)
	started, release := make(chan struct{}), make(chan struct{})
	answered := make(chan error, 1)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		answered <- r.Context().Err()
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(slow.Close)
	sub, err := push.Parse([]byte(subJSON(slow.URL+"/s", goodDH, goodAuth)), f.hosts)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.store.Put(context.Background(), 6, 1, sub, time.Time{}); err != nil {
		t.Fatal(err)
	}
	var later atomic.Bool
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.sender.Run(ctx) }()
	f.sender.Admitted(6, users(1))
	<-started
	f.sender.Admitted(6, func(context.Context) ([]int64, error) { later.Store(true); return nil, nil })
	cancel()
	select {
	case err := <-done:
		t.Fatalf("Run returned (%v) before its request was answered", err)
	default:
	}
	close(release)
	if err := <-answered; err != nil {
		t.Errorf("the request in flight was cut off: %v", err)
	}
	if err := <-done; err != nil {
		t.Errorf("Run = %v, want nil", err)
	}
	if later.Load() {
		t.Error("a batch queued after the stop was sent")
	}
}
