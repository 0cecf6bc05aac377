package gateway

import "bytes"

// reqLines follows one connection's bytes, as fasthttp reads them, to find
// where each request begins, so that every request line is held to the
// CRLF rule: fasthttp parses a request line without keeping it, and the
// raw head badFraming checks starts after it. The splitter checks the
// first head of a connection whole; this covers the later requests of a
// keep-alive connection, where a front proxy and the gateway disagreeing
// on a line end would let a request hide in another's body.
//
// It reads no more than it needs: the end of the request line, the end of
// each header line, a Content-Length and the body it counts. It looks at
// every byte of a header's name, up to its colon or the length of the
// longest name it follows, and then jumps to the line's end (IndexByte):
// a byte-at-a-time walk of every line was a sixth of the gateway's CPU on
// a refused purchase (docs/BENCHMARKS.md). A request it
// cannot follow (a chunked body, a Content-Length it cannot read) ends the
// tracking, and that request's answer closes the connection: no later
// request line goes unchecked.
//
// feed runs in the connection's Read and verdict in the handler, both on
// the one goroutine fasthttp serves the connection with.
type reqLines struct {
	done     uint64 // requests whose heads ended; the current one is done+1
	state    uint8
	lineLen  int   // bytes of the current header line so far
	prevCR   bool  // the last byte was a CR
	clHead   bool  // the current header line is a Content-Length
	clDigits bool  // the Content-Length value has a digit
	clSpace  bool  // a space or tab followed its digits
	skip     bool  // the rest of the current line does not matter
	cl       int64 // the head's Content-Length; -1: none
	body     int64 // body bytes still to pass
	name     [18]byte
	bad      uint64 // first request whose request line ends in a bare LF; 0: none
	lost     uint64 // first request not followed; 0: none
}

const (
	rlStart  uint8 = iota // before a request line (empty lines are skipped, as fasthttp does)
	rlLine                // in the request line
	rlHeader              // in the header lines
	rlBody                // passing a Content-Length body
	rlLost                // not following any more
)

// maxContentLength bounds the Content-Length followed; a larger one is
// not followed (fasthttp refuses a body that large first).
const maxContentLength = 1 << 40

// feed follows the bytes b read from the connection.
func (r *reqLines) feed(b []byte) {
	for len(b) > 0 {
		switch r.state {
		case rlLost:
			return
		case rlBody:
			n := min(int64(len(b)), r.body)
			r.body -= n
			b = b[n:]
			if r.body == 0 {
				r.state = rlStart
			}
		case rlStart, rlLine:
			if r.state == rlLine {
				// Only the line's end matters, and whether a CR came
				// just before it.
				i := bytes.IndexByte(b, '\n')
				if i < 0 {
					r.prevCR = b[len(b)-1] == '\r'
					return
				}
				if i > 0 {
					r.prevCR = b[i-1] == '\r'
				}
				b = b[i:]
			}
			c := b[0]
			b = b[1:]
			switch c {
			case '\n':
				if !r.prevCR && r.bad == 0 {
					r.bad = r.done + 1
				}
				r.prevCR = false
				if r.state == rlLine {
					r.state, r.cl, r.lineLen = rlHeader, -1, 0
				}
			case '\r':
				r.prevCR = true
			default:
				r.prevCR = false
				r.state = rlLine
			}
		case rlHeader:
			if r.skip {
				i := bytes.IndexByte(b, '\n')
				if i < 0 {
					return
				}
				b = b[i:]
			}
			c := b[0]
			b = b[1:]
			switch {
			case c == '\n':
				// A bare LF here is badFraming's to refuse; the line ends
				// for fasthttp all the same.
				if r.lineLen == 0 {
					r.endHead()
				} else if r.clHead && !r.clDigits {
					r.lose()
				}
				r.lineLen, r.prevCR, r.clHead, r.clDigits, r.clSpace, r.skip = 0, false, false, false, false, false
			case c == '\r' && !r.prevCR:
				r.prevCR = true
			default:
				if r.prevCR { // a CR inside a line
					r.header('\r')
				}
				r.prevCR = c == '\r'
				if c != '\r' {
					r.header(c)
				}
			}
		}
	}
}

// header follows one byte of a header line (not its line end).
func (r *reqLines) header(c byte) {
	i := r.lineLen
	r.lineLen++
	if r.clHead {
		r.clByte(c)
		return
	}
	if i >= len(r.name) {
		r.skip = true // longer than any name followed
		return
	}
	r.name[i] = lower(c)
	if c != ':' {
		return
	}
	switch string(r.name[:i]) {
	case "content-length":
		if r.cl >= 0 {
			r.lose() // a second one: badFraming refuses the request
			return
		}
		r.clHead, r.cl = true, 0
	case "transfer-encoding":
		r.lose()
	default:
		r.skip = true
	}
}

// clByte follows one byte of a Content-Length value.
func (r *reqLines) clByte(c byte) {
	switch {
	case c == ' ' || c == '\t':
		if r.clDigits {
			r.clSpace = true
		}
	case '0' <= c && c <= '9' && !r.clSpace && r.cl < maxContentLength:
		r.cl = r.cl*10 + int64(c-'0')
		r.clDigits = true
	default:
		r.lose()
	}
}

// endHead follows the blank line that ends a head.
func (r *reqLines) endHead() {
	r.done++
	if r.cl > 0 {
		r.state, r.body = rlBody, r.cl
		return
	}
	r.state = rlStart
}

// lose ends the tracking at the current request.
func (r *reqLines) lose() {
	if r.state != rlLost {
		r.lost = r.done + 1
		r.state = rlLost
	}
}

// reqLinesVerdict is what reqLines says of one request.
type reqLinesVerdict uint8

const (
	reqLineOK     reqLinesVerdict = iota
	reqLineBareLF                 // its request line ends in a bare LF: refuse it
	reqLineClose                  // not followed: its answer closes the connection
)

// verdict judges request n (fasthttp's ConnRequestNum) of the connection.
func (r *reqLines) verdict(n uint64) reqLinesVerdict {
	if r.bad != 0 && r.bad <= n {
		return reqLineBareLF
	}
	if r.lost != 0 && r.lost <= n {
		return reqLineClose
	}
	return reqLineOK
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}
