package gateway

import (
	"net/netip"

	"github.com/flashsale/flashsale/internal/conn/split"
	"github.com/flashsale/flashsale/internal/conn/watchdog"
)

// publicPort is one Serve's splitter and the watchdog of the connections
// it gives fiber.
type publicPort struct {
	sp *split.Splitter
	wd *watchdog.Watchdog
}

// close stops accepting and routing, and ends the lingering closes: once
// the server shuts down, the clients' answers are theirs to have read.
func (p *publicPort) close() {
	p.sp.Close()
	p.wd.EndLingers()
}

// edgeConn is a connection of the fiber side: watched by the watchdog
// (its timeouts and lingering close), its reads passed through reqLines,
// which edgeChecks asks about each request line. peer is the remote
// address, read once: every request of the connection is checked against
// it (clientAddr), which need not read it through the wrappers'
// RemoteAddr and convert it each time.
type edgeConn struct {
	*watchdog.Conn
	lines reqLines
	peer  netip.Addr
}

func newEdgeConn(c *watchdog.Conn) *edgeConn {
	return &edgeConn{Conn: c, peer: peerAddr(c.RemoteAddr())}
}

func (c *edgeConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.lines.feed(p[:n])
	return n, err
}
