package gateway

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/flashsale/flashsale"
)

// serveUpgrade answers a WebSocket upgrade whose head was read off conn
// (by the splitter, or by fiber on a keep-alive connection): the head is
// parsed once, the queue's handler (wsHandler) runs on the caller's
// goroutine, and the answer is written straight to conn. A handler that
// hijacks (the 101) keeps conn; any other answer is written with
// Connection: close and conn is closed. No net/http server is in the path:
// it would parse the head a second time, in a goroutine of its own whose
// stack grows through the handshake, and sort the 101's headers.
func (s *Server) serveUpgrade(conn net.Conn, head []byte) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = conn.Close()
		return
	}
	s.upgrades.Add(1)
	s.mu.Unlock()
	defer s.upgrades.Done()

	w := &upgradeWriter{conn: conn, header: make(http.Header, 4), timeout: s.cfg.WriteTimeout}
	req, err := http.ReadRequest(bufio.NewReaderSize(bytes.NewReader(head), len(head)))
	if err != nil {
		s.httpFail(w, flashsale.Errorf(flashsale.CodeInvalid, "malformed request head"), 0)
	} else {
		req.RemoteAddr = conn.RemoteAddr().String()
		s.wsMux.ServeHTTP(w, req)
	}
	if !w.hijacked {
		w.finish()
		_ = conn.Close()
	}
}

// upgradeWriter is the http.ResponseWriter and http.Hijacker of
// serveUpgrade: a 101 is written when the handler hijacks; any other
// answer is buffered and written whole by finish.
type upgradeWriter struct {
	conn     net.Conn
	header   http.Header
	status   int
	body     []byte
	hijacked bool
	timeout  time.Duration // bounds each write of the answer
}

func (w *upgradeWriter) Header() http.Header { return w.header }

func (w *upgradeWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}

func (w *upgradeWriter) Write(b []byte) (int, error) {
	if w.hijacked {
		return 0, http.ErrHijacked
	}
	if w.status == 0 {
		w.status = http.StatusOK
	}
	w.body = append(w.body, b...)
	return len(b), nil
}

// Hijack writes the status and headers set so far (the 101 and its
// Upgrade, Connection and Sec-WebSocket-Accept) and hands conn over, with
// hijackBufSize buffers.
func (w *upgradeWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.hijacked {
		return nil, nil, http.ErrHijacked
	}
	w.hijacked = true
	if w.status != 0 {
		if err := w.write(w.head(false)); err != nil {
			_ = w.conn.Close()
			return nil, nil, err
		}
	}
	return w.conn, bufio.NewReadWriter(bufio.NewReaderSize(w.conn, hijackBufSize), bufio.NewWriterSize(w.conn, hijackBufSize)), nil
}

// hijackBufSize sizes the buffers of a hijacked upgrade: the waiting
// room's messages are short (a join, a status), and a WebSocket library
// writes a longer one past an empty buffer.
const hijackBufSize = 256

// finish writes an answer the handler did not hijack.
func (w *upgradeWriter) finish() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	_ = w.write(append(w.head(true), w.body...))
}

// head is the status line and headers; closing adds Content-Length and
// Connection: close (an answer that is not a 101 ends the connection).
func (w *upgradeWriter) head(closing bool) []byte {
	b := make([]byte, 0, 256)
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(w.status), 10)
	b = append(b, ' ')
	b = append(b, http.StatusText(w.status)...)
	b = append(b, "\r\n"...)
	if closing {
		w.header.Set("Content-Length", strconv.Itoa(len(w.body)))
		w.header.Set("Connection", "close")
	}
	for k, vs := range w.header {
		for _, v := range vs {
			b = append(b, k...)
			b = append(b, ": "...)
			b = append(b, headerValue(v)...)
			b = append(b, "\r\n"...)
		}
	}
	return append(b, "\r\n"...)
}

// headerValue drops the line breaks a value must not carry (net/http's
// writer replaces them the same way).
func headerValue(v string) string {
	if !strings.ContainsAny(v, "\r\n") {
		return v
	}
	return strings.Map(func(r rune) rune {
		if r == '\r' || r == '\n' {
			return ' '
		}
		return r
	}, v)
}

func (w *upgradeWriter) write(b []byte) error {
	if w.timeout > 0 {
		_ = w.conn.SetWriteDeadline(time.Now().Add(w.timeout))
		defer func() { _ = w.conn.SetWriteDeadline(time.Time{}) }()
	}
	_, err := w.conn.Write(b)
	return err
}
