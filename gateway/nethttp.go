package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/flashsale/flashsale"
)

// wsHandler routes the public port's WebSocket upgrades (serveUpgrade):
// the waiting room's queue, and 404 for any other path. The address check
// (class join) runs before the upgrade; the Queue then sees the resolved
// client address in r.RemoteAddr.
func (s *Server) wsHandler() http.Handler {
	m := s.metrics.route("queue_ws")
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/flash-sales/sales/{saleId}/queue", func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		defer func() { m.observe(sw.status, 0) }()
		saleID, ok := parseID(r.PathValue("saleId"))
		if !ok {
			s.httpFail(sw, errBadSaleID, 0)
			return
		}
		ap, _ := netip.ParseAddrPort(r.RemoteAddr)
		ip := s.d.Guard.ClientAddr(ap.Addr().Unmap(), strings.Join(r.Header.Values("X-Forwarded-For"), ","))
		if retry, err := s.d.Guard.CheckAddrAt(ip, ClassJoin, s.now()); err != nil {
			s.joinRefused(saleID, err, false)
			s.httpFail(sw, err, retry)
			return
		}
		r.RemoteAddr = netip.AddrPortFrom(ip, ap.Port()).String()
		s.d.Queue.ServeHTTP(sw, r)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.metrics.unrouted.observe(http.StatusNotFound, 0)
		s.httpFail(w, errNotFound, 0)
	})
	return mux
}

// forwardUpgrade answers a WebSocket upgrade that fiber received (on a
// keep-alive connection the splitter gave it) through serveUpgrade: the
// request is serialized again and the connection hijacked. A WebSocket
// client sends nothing before the 101 answer, so fasthttp's read buffer
// holds no bytes of this connection.
func (s *Server) forwardUpgrade(c *fiber.Ctx) error {
	var head bytes.Buffer
	if _, err := c.Request().WriteTo(&head); err != nil {
		return fmt.Errorf("gateway.forwardUpgrade: %w", err)
	}
	fctx := c.Context()
	fctx.HijackSetNoResponse(true)
	fctx.Hijack(func(conn net.Conn) {
		if u, ok := conn.(interface{ UnsafeConn() net.Conn }); ok {
			conn = u.UnsafeConn() // skip fasthttp's pooled reader
		}
		if ec, ok := conn.(*edgeConn); ok {
			ec.Release() // the WebSocket side sets its own deadlines
		}
		_ = conn.SetDeadline(time.Time{})
		s.serveUpgrade(conn, head.Bytes())
	})
	c.Status(http.StatusSwitchingProtocols)
	return nil
}

// httpFail writes err as the contract's error body on a net/http response.
func (s *Server) httpFail(w http.ResponseWriter, err error, retry time.Duration) {
	status, code, msg, orderID := s.resolve(err, "queue_ws")
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		h.Set("Retry-After", strconv.FormatInt(retryAfterSeconds(retry), 10))
	}
	w.WriteHeader(status)
	_, _ = w.Write(errorBody(nil, code, msg, orderID))
}

// statusWriter records the status; Unwrap lets coder/websocket reach the
// http.Hijacker underneath.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ServeAdmin serves the admin port on ln until Shutdown, then returns nil:
// /metrics, /healthz (200 while the process is up), /readyz (200 only when
// Config.Ready returns nil) and /debug/pprof/.
func (s *Server) ServeAdmin(ln net.Listener) error {
	srv := &http.Server{
		Handler:           AdminHandler(s.d.Metrics, s.cfg.Ready),
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       s.cfg.IdleTimeout,
	}
	if !s.track(ln, func() { s.admin = append(s.admin, srv) }) {
		return nil
	}
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// ReadyNote is what a ready func returns for a process that is ready but
// has something to tell its operator (a clock off the fleet's): /readyz
// answers 200, the note on the line after "ready".
type ReadyNote string

func (n ReadyNote) Error() string { return string(n) }

// AdminHandler is the admin port of every flashsale process, with or
// without the gateway role: /metrics from metrics, /healthz (200 while the
// process is up), /readyz (200 when ready returns nil or a ReadyNote, else
// 503 with the reason in the error body; a nil ready is always ready) and
// /debug/pprof/.
func AdminHandler(metrics prometheus.Gatherer, ready func(context.Context) error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(metrics, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if ready != nil {
			ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
			err := ready(ctx)
			cancel()
			var note ReadyNote
			if errors.As(err, &note) {
				w.Header().Set("Content-Type", "text/plain; charset=utf-8")
				_, _ = w.Write([]byte("ready\n" + string(note) + "\n"))
				return
			}
			if err != nil {
				// The admin port is internal: the reason helps the operator.
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write(errorBody(nil, flashsale.CodeUnavailable, err.Error(), ""))
				return
			}
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
