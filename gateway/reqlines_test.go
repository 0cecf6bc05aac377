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
