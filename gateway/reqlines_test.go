package gateway

import (
	"strconv"
	"strings"
	"testing"
)

// feedSplit feeds s to a new reqLines in pieces of at most step bytes.
func feedSplit(s string, step int) *reqLines {
	var r reqLines
	for len(s) > 0 {
		n := min(step, len(s))
		r.feed([]byte(s[:n]))
		s = s[n:]
	}
	return &r
}

func TestReqLines(t *testing.T) {
	get := "GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
	post := func(body string) string {
		return "POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	}
	cases := []struct {
		name      string
		stream    string
		bad, lost uint64
	}{
		{"good requests", get + post("{\n\"a\":1}\n") + get, 0, 0},
		{"empty lines before a request", get + "\r\n\r\n" + get, 0, 0},
		{"bare LF ending the first request line", "GET /a HTTP/1.1\nHost: x\r\n\r\n", 1, 0},
		{"bare LF ending the third", get + post("x\n") + "GET /c HTTP/1.1\nHost: x\r\n\r\n", 3, 0},
		{"a body with a bare LF is a body", post("GET /x HTTP/1.1\nHost: y\n\n") + get, 0, 0},
		{"bare LF empty line before a request", get + "\n" + get, 2, 0},
		{"content-length in any case, spaced", "POST / HTTP/1.1\r\ncontent-LENGTH: \t3 \r\n\r\nabc" + get, 0, 0},
		{"chunked: not followed", get + "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + get, 0, 2},
		{"content-length not a number", "POST / HTTP/1.1\r\nContent-Length: 1e3\r\n\r\n", 0, 1},
		{"content-length empty", "POST / HTTP/1.1\r\nContent-Length:\r\n\r\n", 0, 1},
		{"content-length twice", "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx", 0, 1},
		{"content-length too large", "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", 0, 1},
		{"a long header is passed", get + "GET / HTTP/1.1\r\nX-Long-Header-Name-Here: " + strings.Repeat("v", 300) + "\r\n\r\n" + get, 0, 0},
	}
	for _, tc := range cases {
		for _, step := range []int{1, 2, 7, len(tc.stream)} {
			r := feedSplit(tc.stream, step)
			if r.bad != tc.bad || r.lost != tc.lost {
				t.Errorf("%s (pieces of %d): bad %d lost %d, want bad %d lost %d", tc.name, step, r.bad, r.lost, tc.bad, tc.lost)
			}
		}
	}
}

func TestReqLinesVerdict(t *testing.T) {
	r := feedSplit("GET / HTTP/1.1\r\n\r\nGET / HTTP/1.1\nHost: x\r\n\r\n", 64)
	for n, want := range map[uint64]reqLinesVerdict{1: reqLineOK, 2: reqLineBareLF} {
		if got := r.verdict(n); got != want {
			t.Errorf("verdict(%d) = %d, want %d", n, got, want)
		}
	}
	r = feedSplit("GET / HTTP/1.1\r\n\r\nPOST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 64)
	for n, want := range map[uint64]reqLinesVerdict{1: reqLineOK, 2: reqLineClose} {
		if got := r.verdict(n); got != want {
			t.Errorf("verdict(%d) = %d, want %d", n, got, want)
		}
	}
}

// FuzzReqLines builds a stream of well-formed requests whose bodies are
// the fuzzer's bytes, optionally ending one request line with a bare LF,
// and feeds it in pieces of the fuzzer's size: the tracker must find
// exactly that request, and never lose track of Content-Length bodies.
func FuzzReqLines(f *testing.F) {
	f.Add([]byte("{\"a\":1}"), []byte("GET / HTTP/1.1\n\n"), uint8(0), uint8(3))
	f.Add([]byte{}, []byte("\r\n\r\n"), uint8(2), uint8(1))
	f.Fuzz(func(t *testing.T, body1, body2 []byte, bareAt, step uint8) {
		reqs := []string{
			"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: " + strconv.Itoa(len(body1)) + "\r\n\r\n" + string(body1),
			"GET /b HTTP/1.1\r\nHost: x\r\n\r\n",
			"PUT /c HTTP/1.1\r\ncontent-length: " + strconv.Itoa(len(body2)) + "\r\nX: y\r\n\r\n" + string(body2),
			"GET /d HTTP/1.1\r\n\r\n",
		}
		var want uint64
		if i := int(bareAt) % 5; i < len(reqs) {
			reqs[i] = strings.Replace(reqs[i], " HTTP/1.1\r\n", " HTTP/1.1\n", 1)
			want = uint64(i + 1)
		}
		r := feedSplit(strings.Join(reqs, ""), int(step)%64+1)
		if r.bad != want || r.lost != 0 {
			t.Fatalf("bad %d lost %d, want bad %d lost 0", r.bad, r.lost, want)
		}
	})
}

// FuzzReqLinesMatchesReference: on any bytes fed in any pieces, reqLines
// (which jumps over the bytes of a line that do not matter) ends every
// piece in the state the byte-at-a-time walk it replaced reaches, with the
// same verdicts.
func FuzzReqLinesMatchesReference(f *testing.F) {
	f.Add([]byte("GET /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabcGET / HTTP/1.1\n\r\n"), uint8(5))
	f.Add([]byte("POST / HTTP/1.1\r\nX-A-Very-Long-Header-Name: v\r\ncontent-length: 1\r\n\r\nx\r\n\nGET /\r\r\n\r\n"), uint8(1))
	f.Add([]byte("GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"), uint8(64))
	f.Add([]byte("GET / HTTP/1.1\r\nHost:\ra:b\r\nContent-Length:\r 2\r\n\r\nab"), uint8(2))
	f.Fuzz(func(t *testing.T, data []byte, step uint8) {
		var got reqLines
		var want refReqLines
		n := int(step)%64 + 1
		for b := data; len(b) > 0; {
			k := min(n, len(b))
			got.feed(b[:k])
			want.feed(b[:k])
			b = b[k:]
			if got.done != want.done || got.bad != want.bad || got.lost != want.lost || got.state != want.state ||
				(got.state == rlBody && got.body != want.body) {
				t.Fatalf("after %d bytes: done %d bad %d lost %d state %d body %d; the byte walk: done %d bad %d lost %d state %d body %d",
					len(data)-len(b), got.done, got.bad, got.lost, got.state, got.body, want.done, want.bad, want.lost, want.state, want.body)
			}
		}
	})
}

// refReqLines is reqLines as it was before it jumped to line ends: one
// byte at a time. FuzzReqLinesMatchesReference holds the two to the same
// answers.
type refReqLines struct {
	done     uint64 // requests whose heads ended; the current one is done+1
	state    uint8
	lineLen  int   // bytes of the current header line so far
	prevCR   bool  // the last byte was a CR
	clHead   bool  // the current header line is a Content-Length
	clDigits bool  // the Content-Length value has a digit
	clSpace  bool  // a space or tab followed its digits
	cl       int64 // the head's Content-Length; -1: none
	body     int64 // body bytes still to pass
	name     [18]byte
	bad      uint64 // first request whose request line ends in a bare LF; 0: none
	lost     uint64 // first request not followed; 0: none
}

// feed follows the bytes b read from the connection.
func (r *refReqLines) feed(b []byte) {
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
				r.lineLen, r.prevCR, r.clHead, r.clDigits, r.clSpace = 0, false, false, false, false
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
func (r *refReqLines) header(c byte) {
	i := r.lineLen
	r.lineLen++
	if r.clHead {
		r.clByte(c)
		return
	}
	if i >= len(r.name) {
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
	}
}

// clByte follows one byte of a Content-Length value.
func (r *refReqLines) clByte(c byte) {
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
func (r *refReqLines) endHead() {
	r.done++
	if r.cl > 0 {
		r.state, r.body = rlBody, r.cl
		return
	}
	r.state = rlStart
}

// lose ends the tracking at the current request.
func (r *refReqLines) lose() {
	if r.state != rlLost {
		r.lost = r.done + 1
		r.state = rlLost
	}
}

// benchRequest is a purchase as the load tool sends it: an access token
// and an admission token in the head, no body.
var benchRequest = []byte("POST /api/flash-sales/items/101/purchase HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n" +
	"Authorization: Bearer " + strings.Repeat("a", 180) + "\r\nX-Admission-Token: " + strings.Repeat("b", 160) + "\r\n" +
	"Content-Length: 0\r\n\r\n")

// BenchmarkReqLines: following one purchase's head, as the gateway does
// (jumping to line ends), against the byte-at-a-time walk it replaced.
//
//	go test -run '^$' -bench ReqLines ./gateway/
func BenchmarkReqLines(b *testing.B) {
	b.Run("jump", func(b *testing.B) {
		var r reqLines
		b.SetBytes(int64(len(benchRequest)))
		for b.Loop() {
			r.feed(benchRequest)
		}
	})
	b.Run("byte-walk", func(b *testing.B) {
		var r refReqLines
		b.SetBytes(int64(len(benchRequest)))
		for b.Loop() {
			r.feed(benchRequest)
		}
	})
}
