package gateway

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/admission"
	"github.com/flashsale/flashsale/auth"
)

// The two benchmarks below drive the same in-memory client against a bare
// fiber handler answering 410 and against the gateway's purchase route for
// a sold-out item (real access and admission token checks, a Guard that
// allows everything, an in-memory sale cache). Compare their ns/op: the
// gateway's sold-out path should stay within ~15% of the bare handler.
//
//	go test -run '^$' -bench 'BareFiber|PurchaseSoldOut' -benchmem ./gateway/

// driveApp serves app on an in-memory listener and sends req in parallel,
// expecting status want.
func driveApp(b *testing.B, app *fiber.App, prepare func(*fasthttp.Request), want int) {
	b.Helper()
	ln := fasthttputil.NewInmemoryListener()
	go func() { _ = app.Listener(ln) }()
	b.Cleanup(func() { _ = app.Shutdown() })
	peer := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 40000}
	client := &fasthttp.Client{
		Dial:            func(string) (net.Conn, error) { return ln.DialWithLocalAddr(peer) },
		MaxConnsPerHost: 512,
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req := fasthttp.AcquireRequest()
		res := fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(res)
		prepare(req)
		for pb.Next() {
			if err := client.Do(req, res); err != nil {
				b.Error(err)
				return
			}
			if res.StatusCode() != want {
				b.Errorf("status %d: %s", res.StatusCode(), res.Body())
				return
			}
		}
	})
}

func BenchmarkBareFiber(b *testing.B) {
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Post("/api/flash-sales/items/:itemId/purchase", func(c *fiber.Ctx) error {
		c.Status(fiber.StatusGone)
		c.Response().Header.SetContentType(fiber.MIMEApplicationJSON)
		return c.Send(soldOutBody)
	})
	// The same request as BenchmarkPurchaseSoldOut, tokens included, so
	// both parse the same bytes.
	now := time.Now()
	tok, adm := benchTokens(b, now)
	driveApp(b, app, func(req *fasthttp.Request) {
		req.Header.SetMethod("POST")
		req.SetRequestURI("http://gw/api/flash-sales/items/101/purchase")
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set(HeaderAdmissionToken, adm)
	}, fiber.StatusGone)
}

func benchSigner(b *testing.B) *admission.Signer {
	b.Helper()
	signer, err := admission.NewSigner(admission.Key{ID: 1, Secret: []byte("admission-secret-0123456789")})
	if err != nil {
		b.Fatal(err)
	}
	return signer
}

func benchTokens(b *testing.B, now time.Time) (access, adm string) {
	b.Helper()
	tok, err := auth.Mint(testSecret, 7, false, time.Hour, now)
	if err != nil {
		b.Fatal(err)
	}
	return tok, benchSigner(b).Sign(flashsale.Admission{UserID: 7, SaleID: 1, ExpiresAt: now.Add(time.Hour)})
}

// benchSales is a one-sale cache with no locking, like a copy-on-write
// cache.
type benchSales struct{ sale *flashsale.Sale }

func (s benchSales) Sale(id int64) (*flashsale.Sale, bool) { return s.sale, id == s.sale.ID }
func (s benchSales) ItemSale(itemID int64) (*flashsale.Sale, flashsale.Item, bool) {
	it, ok := s.sale.Item(itemID)
	return s.sale, it, ok
}

type benchPurchase struct{}

func (benchPurchase) SoldOut(int64) bool { return true }
func (benchPurchase) Reserve(context.Context, *flashsale.Sale, flashsale.Item, int64) (string, error) {
	panic("Reserve reached on the sold-out path")
}
func (benchPurchase) Claim(context.Context, *flashsale.Sale, flashsale.Item, int64) (string, error) {
	panic("Claim reached on the sold-out path")
}

func BenchmarkPurchaseSoldOut(b *testing.B) {
	now := time.Now()
	sale := &flashsale.Sale{ID: 1, StartsAt: now.Add(-time.Minute), Items: []flashsale.Item{{ID: 101, SaleID: 1, Quantity: 1}}}
	signer := benchSigner(b)
	tok, adm := benchTokens(b, now)
	srv := New(Config{}, Deps{
		Access:    auth.NewCache(auth.NewVerifier(testSecret), 1<<16), // as deployed (internal/wiring)
		Admission: signer,
		Sales:     benchSales{sale},
		Purchase:  benchPurchase{},
	})
	driveApp(b, srv.App(), func(req *fasthttp.Request) {
		req.Header.SetMethod("POST")
		req.SetRequestURI("http://gw/api/flash-sales/items/101/purchase")
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set(HeaderAdmissionToken, adm)
	}, fiber.StatusGone)
}

// driveHandler calls app's fasthttp handler directly (no connection, no
// parsing), for a low-noise comparison and allocation counts.
func driveHandler(b *testing.B, app *fiber.App, tok, adm string) {
	b.Helper()
	h := app.Handler()
	var ctx fasthttp.RequestCtx
	ctx.Init(&fasthttp.Request{}, &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 40000}, nil)
	auth := "Bearer " + tok
	b.ReportAllocs()
	for b.Loop() {
		ctx.Request.Reset()
		ctx.Response.Reset()
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.SetRequestURI("/api/flash-sales/items/101/purchase")
		ctx.Request.Header.Set("Authorization", auth)
		ctx.Request.Header.Set(HeaderAdmissionToken, adm)
		h(&ctx)
		if ctx.Response.StatusCode() != fiber.StatusGone {
			b.Fatalf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
		}
	}
}

func BenchmarkBareFiberHandler(b *testing.B) {
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Post("/api/flash-sales/items/:itemId/purchase", func(c *fiber.Ctx) error {
		c.Status(fiber.StatusGone)
		c.Response().Header.SetContentType(fiber.MIMEApplicationJSON)
		return c.Send(soldOutBody)
	})
	tok, adm := benchTokens(b, time.Now())
	driveHandler(b, app, tok, adm)
}

func BenchmarkPurchaseSoldOutHandler(b *testing.B) {
	now := time.Now()
	sale := &flashsale.Sale{ID: 1, StartsAt: now.Add(-time.Minute), Items: []flashsale.Item{{ID: 101, SaleID: 1, Quantity: 1}}}
	signer := benchSigner(b)
	tok, adm := benchTokens(b, now)
	srv := New(Config{}, Deps{Access: auth.NewCache(auth.NewVerifier(testSecret), 1<<16), Admission: signer, Sales: benchSales{sale}, Purchase: benchPurchase{}})
	driveHandler(b, srv.App(), tok, adm)
}

// BenchmarkUpgrade: WebSocket upgrades on new connections through the
// public port (splitter, serveUpgrade, the address check) to a queue
// handler that accepts, writes one message and closes. Client and server
// share this process, so ns/op is both sides of an upgrade: compare runs
// of the same client.
//
//	go test -run '^$' -bench Upgrade -benchmem ./gateway/
func BenchmarkUpgrade(b *testing.B) {
	e := newEnv(b)
	e.queue.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		_ = c.Write(r.Context(), websocket.MessageText, []byte(`{"type":"status"}`))
		_ = c.CloseNow()
	})
	addr := serve(b, e)
	head := []byte("GET /api/flash-sales/sales/1/queue HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = conn.Write(head)
			br := bufio.NewReader(conn)
			res, err := http.ReadResponse(br, nil)
			if err != nil || res.StatusCode != http.StatusSwitchingProtocols {
				b.Errorf("upgrade: %v %v", res, err)
				conn.Close()
				return
			}
			if _, err := io.ReadFull(br, make([]byte, 2+len(`{"type":"status"}`))); err != nil {
				b.Error(err)
			}
			conn.Close()
		}
	})
}
