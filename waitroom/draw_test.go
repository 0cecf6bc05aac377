package waitroom

import (
	"crypto/aes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"math/bits"
	"testing"
)

// refPlace is an independent implementation of docs/DRAW.md, written from
// the document (not from draw.go), used to check the room's draw.
func refPlace(seed []byte, n, i uint64) uint64 {
	if n == 1 {
		return 0
	}
	k := uint(bits.Len64(n - 1)) // bits to hold n-1
	h := (k + 1) / 2
	mask := uint64(1)<<h - 1
	kdf := hmac.New(sha256.New, seed)
	kdf.Write([]byte("flashsale/draw/v2"))
	kdf.Write(binary.BigEndian.AppendUint64(nil, n))
	key := kdf.Sum(nil)[:16]
	f := func(round byte, x uint64) uint64 {
		c, err := aes.NewCipher(key)
		if err != nil {
			panic(err)
		}
		in := make([]byte, 16)
		in[0] = round
		binary.BigEndian.PutUint64(in[8:], x)
		out := make([]byte, 16)
		c.Encrypt(out, in)
		return binary.BigEndian.Uint64(out[:8]) & mask
	}
	enc := func(x uint64) uint64 {
		l, r := x>>h, x&mask
		for j := 0; j < 8; j++ {
			l, r = r, l^f(byte(j), r)
		}
		return l<<h | r
	}
	y := enc(i)
	for y >= n {
		y = enc(y)
	}
	return y
}

func TestPermuteIsAPermutation(t *testing.T) {
	seed := []byte("0123456789abcdef0123456789abcdef")
	tests := []struct {
		name string
		n    uint64
	}{
		{"one", 1}, {"two", 2}, {"three", 3}, {"power of two", 64}, {"odd bits", 1000}, {"just over", 1025}, {"bigger", 5000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seen := make([]bool, tt.n)
			p := NewPermuter(seed, tt.n)
			for i := uint64(0); i < tt.n; i++ {
				got := p.Place(i)
				if got >= tt.n {
					t.Fatalf("Place(%d) = %d, out of [0,%d)", i, got, tt.n)
				}
				if seen[got] {
					t.Fatalf("Place(%d) = %d twice", i, got)
				}
				seen[got] = true
				if want := refPlace(seed, tt.n, i); got != want {
					t.Fatalf("Place(%d) = %d, reference says %d", i, got, want)
				}
				if one := Permute(seed, tt.n, i); one != got {
					t.Fatalf("Permute = %d, Permuter = %d", one, got)
				}
			}
		})
	}
}

func TestPermuteDependsOnSeed(t *testing.T) {
	a := []byte("0123456789abcdef0123456789abcdef")
	b := []byte("0123456789abcdef0123456789abcdeF")
	same := 0
	for i := uint64(0); i < 1000; i++ {
		if Permute(a, 1000, i) == Permute(b, 1000, i) {
			same++
		}
	}
	if same > 20 { // a random pair of permutations shares ~1 fixed point
		t.Fatalf("%d of 1000 places equal under different seeds", same)
	}
}

func BenchmarkPermute(b *testing.B) {
	p := NewPermuter([]byte("0123456789abcdef0123456789abcdef"), 500_000)
	for i := 0; b.Loop(); i++ {
		p.Place(uint64(i % 500_000))
	}
}
