package gateway

import (
	"strings"
	"testing"
)

func TestBadFraming(t *testing.T) {
	tests := []struct {
		name, head, want string
	}{
		{"no headers", "\r\n", ""},
		{"plain", "Host: x\r\nContent-Length: 3\r\n\r\n", ""},
		{"chunked", "Host: x\r\nTransfer-Encoding: chunked\r\n\r\n", ""},
		{"chunked any case", "transfer-encoding:  Chunked \r\n\r\n", ""},
		{"bytes after the head", "Host: x\r\n\r\nGET / HTTP/1.1\nX: y\n\n", ""},
		{"CL and TE", "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", framingCLTE},
		{"TE and CL", "Transfer-Encoding: chunked\r\ncontent-length: 3\r\n\r\n", framingCLTE},
		{"xchunked", "Transfer-Encoding: xchunked\r\n\r\n", framingTE},
		{"chunked list", "Transfer-Encoding: gzip, chunked\r\n\r\n", framingTE},
		{"identity", "Transfer-Encoding: identity\r\n\r\n", framingTE},
		{"two TE", "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", framingDupTE},
		{"duplicate CL", "Content-Length: 3\r\nContent-Length: 3\r\n\r\n", framingDupCL},
		{"differing CL", "Content-Length: 3\r\nCONTENT-LENGTH: 4\r\n\r\n", framingDupCL},
		{"bare LF", "Host: x\nContent-Length: 3\r\n\r\n", framingBareLF},
		{"bare LF blank line", "Host: x\r\n\n", framingBareLF},
		{"folded", "X-A: 1\r\n chunked\r\n\r\n", framingFolded},
		{"space before colon", "Transfer-Encoding : chunked\r\n\r\n", framingSpaceName},
		{"truncated", "Host: x\r\nContent-Le", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := badFraming([]byte(tc.head)); got != tc.want {
				t.Errorf("badFraming(%q) = %q, want %q", tc.head, got, tc.want)
			}
		})
	}
}

func TestBadFirstHead(t *testing.T) {
	tests := []struct {
		name, head, want string
	}{
		{"good", "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", ""},
		{"colon and space in the request line", "GET http://x:80/a%20b HTTP/1.1\r\nHost: x\r\n\r\n", ""},
		{"bare LF request line", "POST /a HTTP/1.1\nHost: x\r\n\r\n", framingBareLF},
		{"headers checked", "POST /a HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", framingDupCL},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := badFirstHead([]byte(tc.head)); got != tc.want {
				t.Errorf("badFirstHead(%q) = %q, want %q", tc.head, got, tc.want)
			}
		})
	}
}

// refFraming is badFraming written plainly, for the fuzz target.
func refFraming(head string) string {
	var cl, te int
	for {
		line, rest, ok := strings.Cut(head, "\n")
		if !ok {
			return ""
		}
		head = rest
		l, crlf := strings.CutSuffix(line, "\r")
		if !crlf {
			return framingBareLF
		}
		if l == "" {
			return ""
		}
		if l[0] == ' ' || l[0] == '\t' {
			return framingFolded
		}
		name, value, ok := strings.Cut(l, ":")
		if !ok || name == "" {
			continue
		}
		if strings.HasSuffix(name, " ") || strings.HasSuffix(name, "\t") {
			return framingSpaceName
		}
		switch {
		case strings.EqualFold(name, "content-length") && isASCII(name):
			if cl++; cl > 1 {
				return framingDupCL
			}
		case strings.EqualFold(name, "transfer-encoding") && isASCII(name):
			if te++; te > 1 {
				return framingDupTE
			}
			if !strings.EqualFold(strings.Trim(value, " \t"), "chunked") || !isASCII(value) {
				return framingTE
			}
		}
		if cl > 0 && te > 0 {
			return framingCLTE
		}
	}
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

func FuzzBadFraming(f *testing.F) {
	for _, s := range []string{
		"Host: x\r\n\r\n",
		"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
		"Transfer-Encoding: xchunked\r\n\r\n",
		"Content-Length: 1\r\nContent-Length: 1\r\n\r\n",
		"Host: x\nX: y\n\n",
		"X: 1\r\n\tfolded\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, want := badFraming(b), refFraming(string(b))
		if got != want {
			t.Fatalf("badFraming(%q) = %q, reference %q", b, got, want)
		}
		_ = badFirstHead(b)
	})
}
