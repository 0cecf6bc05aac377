package gateway

import (
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
// which edgeChecks asks about each request line.
type edgeConn struct {
	*watchdog.Conn
	lines reqLines
}

func (c *edgeConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.lines.feed(p[:n])
	return n, err
}
